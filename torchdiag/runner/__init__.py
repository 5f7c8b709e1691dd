"""Running a command, below the CLI and beside the Python API: torch-free at import.

- job.py      Job: what to run (command, run-wide fields, the diagnostic's Options, files asked for, hooks),
              and the RunSpec built from it (`run_spec`, shared with the Python API).
- outcome.py  Outcome and `failed(exc)`: the one exception -> exit code / message / hint / partial ladder.
- local.py    `execute(job)`: one process; `invoke(...)`: a diagnostic on a model already in hand (API, check).
- ranks.py    `execute_ranks(job, ranks)`: under torchrun, per rank (shard, unused-parameter probe, FSDP
              refusal, records, gather, merge, cross-rank check), rank 0's Outcome for all.
- merge.py, report.py, consistency.py, unused.py: the per-rank pieces (records -> one Result, cross-rank
              findings, the cross-rank step check, parameters with no gradient on a rank).
- check.py    `check`, the orchestrator: configured diagnostics on configured models, one gate.
- isolation.py the boundary around the user's code (stdout, stdin, os._exit, SIGTERM)."""
