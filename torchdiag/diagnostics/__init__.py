"""One module per diagnostic: `Options` + `run(model, inputs, opts) -> Result`. Never prints."""
