"""Under torchrun: which rank this process is, the process groups, this rank's shard of the batch, the
model wrapped as asked (--wrap none|ddp|fsdp), the gather of the ranks' results to rank 0, teardown.

torchdiag never launches processes itself: torchrun (torch.distributed.run) starts one per rank and
sets RANK, WORLD_SIZE and LOCAL_RANK. `current()` reads them without importing torch (plain
`torchdiag` and `--help` stay as they are). Two process groups: the default one (nccl on CUDA, gloo on
CPU) carries the model's collectives (DDP, FSDP); a second gloo group carries only torchdiag's own
exchanges (statuses, checksums, the final gather), so a rank that failed can still hand in its error
while a peer is stuck in (or timed out of) a model collective."""
from __future__ import annotations

import contextlib
import itertools
import os
from dataclasses import dataclass, replace
from typing import Any

from ..errors import ModelError, UsageError, one_line

# Seconds a model collective (DDP allreduce, FSDP all-gather) may wait for a peer before it fails: a
# rank whose model raised mid-step leaves its peers waiting this long, then they report it.
TIMEOUT_ENV = "TORCHDIAG_DIST_TIMEOUT"
DEFAULT_TIMEOUT = 600
TORCHRUN_HINT = "launch with torchrun, e.g. torchrun --nproc_per_node 2 -m torchdiag COMMAND SPEC --wrap ddp"


@dataclass(frozen=True)
class Ranks:
    """This process under torchrun. `backend` and `device` are filled in by `setup()`."""

    rank: int
    world_size: int
    local_rank: int
    backend: str = ""
    device: str = ""
    local_world: int = 1   # the ranks on this host (LOCAL_WORLD_SIZE): they share its memory

    @property
    def main(self) -> bool:
        return self.rank == 0

    def describe(self) -> str:
        return f"{self.rank} of {self.world_size}"


def current() -> Ranks | None:
    """This process's rank from torchrun's environment; None outside torchrun or with one process."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ["RANK"])
    except (KeyError, ValueError):
        return None
    if world <= 1:
        return None
    try:   # torchrun sets it; a launcher that does not: 1, this process's own (a review: the world over-refused)
        local_world = min(max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1), world)
    except ValueError:
        local_world = 1
    return Ranks(rank, world, int(os.environ.get("LOCAL_RANK", rank)), local_world=local_world)


def refuse_wrap(spec) -> None:
    """--wrap ddp|fsdp outside torchrun: there is no process group to wrap with (exit 2)."""
    if spec.wrap != "none":
        from ..errors import option_name

        raise UsageError(f"{option_name('wrap', spec.caller)} {spec.wrap} needs several processes started by torchrun",
                         hint=TORCHRUN_HINT)


def is_sharded(params) -> bool:
    """Is any of these parameters a DTensor shard (fully_shard's)? Torch-free: DTensors have full_tensor."""
    return any(hasattr(p, "full_tensor") for p in params)


def refuse_sharded(model, what: str = "the model given") -> None:
    """A model already sharded by fully_shard (its parameters are DTensors) handed to the Python API: every
    diagnostic copies and reads plain tensors (exit 2, never a DTensor error from deep inside)."""
    if is_sharded(model.parameters()):
        raise UsageError(f"{what} is sharded by FSDP (fully_shard: its parameters are DTensors); torchdiag runs "
                         "on the plain model and wraps its own copies",
                         hint="give the model before fully_shard, and run it under torchrun with --wrap fsdp: torchrun "
                              "--nproc_per_node N -m torchdiag COMMAND SPEC --wrap fsdp")


def rank_device(ranks: Ranks, text: str):
    """--device under torchrun: auto/cuda → cuda:LOCAL_RANK (else cpu for auto), cpu; meta, mps and an
    explicit cuda:N are refused (each rank takes its own GPU)."""
    import torch

    name = (text or "auto").strip().lower()
    if name == "meta":
        raise UsageError("--device meta cannot run under torchrun: ranks exchange real values",
                         hint="use --device cpu or cuda (or run without torchrun for a meta estimate)")
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if name not in ("auto", "cuda"):
        raise UsageError(f"--device {text} is not supported under torchrun",
                         hint="use --device cuda (each rank takes cuda:LOCAL_RANK) or --device cpu")
    if not torch.cuda.is_available():
        raise UsageError("--device cuda is not available: no CUDA GPU is visible", hint="use --device cpu (gloo)")
    if ranks.local_rank >= torch.cuda.device_count():
        raise UsageError(f"local rank {ranks.local_rank} has no GPU: this node has {torch.cuda.device_count()}",
                         hint="start at most one process per GPU (--nproc_per_node)")
    return torch.device("cuda", ranks.local_rank)


@dataclass
class Session:
    """The live process groups of one run: `group` is torchdiag's own gloo group."""

    ranks: Ranks
    group: Any

    def gather(self, obj) -> list | None:
        """Every rank's `obj` on rank 0 (in rank order); None on the other ranks."""
        import torch.distributed as dist

        out = [None] * self.ranks.world_size if self.ranks.main else None
        with _peer_gone():
            dist.gather_object(obj, out, dst=0, group=self.group)
        return out

    def all_gather(self, obj) -> list:
        import torch.distributed as dist

        out = [None] * self.ranks.world_size
        with _peer_gone():
            dist.all_gather_object(out, obj, group=self.group)
        return out


@contextlib.contextmanager
def _peer_gone():
    """A peer's process ended before it handed in its part (its code raised KeyboardInterrupt or SystemExit where
    nothing catches it, a signal killed it): said as that, following the peer, not as torchdiag's internal error (a
    review)."""
    try:
        yield
    except RuntimeError as exc:
        if "closed by peer" not in str(exc) and "Connection reset" not in str(exc):
            raise
        err = ModelError("another rank stopped before handing in its part (interrupted, killed or exited)",
                         hint="torchrun's summary below gives its exit code; a line of its own above, if any, says why")
        err.follows_peer = True
        raise err from exc


@contextlib.contextmanager
def session(ranks: Ranks, spec):
    """The process groups for this run, destroyed on the way out whatever happened (error, Ctrl-C). A
    default group already up in this process (a program that runs torchdiag's command line in-process on
    each rank) is borrowed, not re-made: its rendezvous keys are spent, and it is the program's to destroy;
    only torchdiag's own groups are made and destroyed here."""
    import datetime

    import torch
    import torch.distributed as dist

    device = rank_device(ranks, spec.device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timeout_seconds()
    ranks = replace(ranks, backend=backend, device=str(device))
    borrowed, group = dist.is_available() and dist.is_initialized(), None
    try:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if borrowed:
            _check_borrowed(ranks, backend)
        else:
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout),
                                    device_id=device if device.type == "cuda" else None)
        group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=max(3600, 3 * timeout)))
        global _DECISIONS
        # longer than a model collective's: a rank asks here while its peer may still wait out a reduction
        _DECISIONS = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=2 * timeout + 30))
    except UsageError:
        teardown(keep_default=borrowed, groups=(group,))
        raise
    except Exception as exc:
        teardown(keep_default=borrowed, groups=(group,))
        raise UsageError(f"cannot join the process group ({backend}): {one_line(exc)}",
                         hint="start with torchrun; every rank must reach the rendezvous") from exc
    try:
        yield Session(ranks, group)
    finally:
        teardown(keep_default=borrowed, groups=(group,))


def _check_borrowed(ranks: Ranks, backend: str) -> None:
    """The default group already up must be torchrun's world and carry this run's collectives."""
    import torch.distributed as dist

    have = str(dist.get_backend())
    if (dist.get_rank(), dist.get_world_size()) != (ranks.rank, ranks.world_size) or backend not in have:
        raise UsageError(f"this process already has a process group (rank {dist.get_rank()} of "
                         f"{dist.get_world_size()}, {have}) that cannot carry this run (rank {ranks.describe()}, "
                         f"{backend})", hint="run torchdiag in a process of its own under torchrun")


_GATHERS = itertools.count()   # gathers made by this process (gather_to_main)


def gather_to_main(obj, ranks: Ranks) -> tuple[list, list[int]] | None:
    """For a user's script run on every rank (watch), at its end: every rank's `obj` on rank 0, as
    (objects in rank order with None for a rank that never handed one in, the ranks missing); None on the
    others. Through torchrun's own rendezvous store (the agent's, which outlives the script's process
    groups), not a collective: a rank puts its object and may exit at once; rank 0 waits for the others
    at most TORCHDIAG_DIST_TIMEOUT seconds. (A fresh process group here raced: a rank that finished
    first could join the script's old rendezvous keys while its peer was still training, and hang it.)"""
    import datetime
    import json

    import torch.distributed as dist

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise RuntimeError("torchrun's rendezvous store is not shared with the ranks (TORCHELASTIC_USE_AGENT_STORE)")
    timeout = datetime.timedelta(seconds=timeout_seconds())
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), ranks.world_size,
                          is_master=False, timeout=timeout)
    # one key set per gather: a second watch in the same run must not read the first one's records (every rank
    # gathers in the same order, so the count agrees)
    prefix = (f"torchdiag/gather/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/"
              f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{next(_GATHERS)}/")
    # JSON, never pickle: the store is a TCP server, and what comes out of it must not be able to run code
    store.set(prefix + str(ranks.rank), json.dumps(obj, default=str))
    if not ranks.main:
        return None
    keys = [prefix + str(r) for r in range(ranks.world_size)]
    try:
        store.wait(keys, timeout)
    except Exception:   # a rank died or hangs: the ones that arrived
        pass
    here = [store.check([k]) for k in keys]
    return [json.loads(store.get(k)) if ok else None for k, ok in zip(keys, here)], \
        [r for r, ok in enumerate(here) if not ok]


def timeout_seconds() -> int:
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        return max(1, int(text)) if text else DEFAULT_TIMEOUT
    except ValueError:
        raise UsageError(f"{TIMEOUT_ENV}={text!r} is not a number of seconds") from None


def teardown(keep_default: bool = False, groups: tuple = ()) -> None:
    """destroy_process_group if one is up (only torchdiag's own groups where the default one was borrowed);
    never raises (it runs on the error path too)."""
    global _DECISIONS
    own, _DECISIONS = [*groups, _DECISIONS], None
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return
        if not keep_default:
            dist.destroy_process_group()
            return
        for group in own:
            if group is not None:
                dist.destroy_process_group(group)
    except Exception:
        pass


def rank_spec(spec, ranks: Ranks):
    """The RunSpec one rank runs: the device resolved for this rank."""
    return replace(spec, device=ranks.device)


def shard_bounds(n: int, ranks: Ranks) -> tuple[int, int]:
    """Rows [start, stop) of a batch of n for this rank: torch.tensor_split's rule, the first n % W
    ranks take one row more; a batch smaller than the world is refused (a rank would get no row)."""
    w = ranks.world_size
    if n < w:
        raise UsageError(f"a batch of {n} row(s) cannot give each of the {w} ranks a row: the batch is split along dim 0",
                         hint=f"give a batch of at least {w} rows (the first dimension of -i, or of --batch's inputs)")
    size, extra = divmod(n, w)
    start = ranks.rank * size + min(ranks.rank, extra)
    return start, start + size + (1 if ranks.rank < extra else 0)


def shard(inputs, target, ranks: Ranks):
    """(inputs, target, description) for this rank: every tensor whose dim 0 is the batch (the first
    input's dim 0) is cut to this rank's rows, the --batch target too; other tensors (a shared mask)
    go whole to every rank."""
    n = inputs.batch_size
    if n is None:
        raise UsageError("under torchrun each rank takes its rows of the batch (dim 0), but the first input has no dim 0",
                         hint="give inputs with a batch dimension")
    start, stop = shard_bounds(n, ranks)

    def cut(t):
        return t[start:stop] if t.dim() and t.shape[0] == n and not t.is_nested else t

    if target is not None and hasattr(target, "dim"):
        target = cut(target)
    even = "" if n % ranks.world_size == 0 else f"; {n} is not divisible by {ranks.world_size}: the first ranks take one row more"
    whole = [f"{label} ({'nested' if t.is_nested else 'x'.join(map(str, t.shape)) or 'scalar'})"
             for label, t in inputs.tensors() if t.is_nested or not (t.dim() and t.shape[0] == n)]
    kept = f"; given whole to every rank: {', '.join(whole)}" if whole else ""
    return inputs.map(cut), target, f"rows {start}:{stop} of {n}{even}{kept}"


def wrap(model, ranks: Ranks, how: str):
    """The model as each rank trains it: as is, in DistributedDataParallel, or sharded in place by
    torch's own fully_shard (FSDP2) at the root."""
    if how == "none":
        return model
    import torch

    device = torch.device(ranks.device)
    if how == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        if not any(p.requires_grad for p in model.parameters()):
            raise UsageError("--wrap ddp: the model has no trainable parameter, so DDP has nothing to synchronise",
                             hint="use --wrap none")
        try:
            return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        except Exception as exc:
            raise ModelError(f"wrapping the model in DistributedDataParallel failed: {one_line(exc)}") from exc
    return _fully_shard(model, ranks, device)


# Under torchrun: a gloo group for agree() alone (its timeout outlasts a model collective's). Never the model's
# group: a rank that failed in backward and asks whether anyone failed would pair its all_reduce with a
# peer's pending DDP/FSDP reduction (gloo aborts the process: "collective mismatch"); here it waits until
# the peer times out of that reduction and asks too. Not torchdiag's gather group either (a rank that
# left run() is in the gather, a peer still in an agreement).
_DECISIONS = None


def agree(flags: list[bool], device, group=None) -> list[bool]:
    """Each flag true on any rank: one all_reduce (MAX) of Python flags, on the CPU, over the decisions
    group (else `group` on `device`). A value-dependent decision (overfit-batch's stop, a failed pass)
    taken around the wrapped model must be the same on every rank, or a rank would wait for its peers in
    the next collective."""
    import torch
    import torch.distributed as dist

    if _DECISIONS is not None:
        group, device = _DECISIONS, "cpu"
    t = torch.tensor([1.0 if f else 0.0 for f in flags], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return [v > 0 for v in t.tolist()]


def on_every_rank(make, device):
    """make() a copy that every rank then uses in collectives (DDP broadcasts, FSDP shards, ranks compare states):
    where it is refused on any rank (its memory full: NoRoom), every rank raises, the refusing one its own error, the
    others an echo that follows it in the report; else a peer would wait in the collective for the distributed
    timeout. With no process group up (a wrapper set in one process) there are no peers to tell."""
    import torch.distributed as dist

    from .train import NoRoom

    try:
        work, refused = make(), None
    except NoRoom as exc:
        work, refused = None, exc
    anyone = dist.is_available() and dist.is_initialized() and agree([refused is not None], device)[0]
    if refused is not None:
        raise refused
    if not anyone:
        return work
    err = NoRoom("a copy of the model did not fit on another rank (the refusing rank's error says why)")
    err.follows_peer = True
    raise err


def refuse_divergent(model, wrap: str) -> None:
    """Before --wrap ddp/fsdp: every rank's parameters (names, shapes, dtypes) must be the same, or the
    wrapper's collectives mismatch (gloo aborts rank 0 without a word; DDP waits out its timeout); under ddp its
    buffers too, which DDP broadcasts from rank 0 (a review: a buffer on one rank only hung that broadcast, then
    doctor passed). One all_gather over the decisions group; every rank raises the same error, naming the first
    that differs."""
    import torch.distributed as dist

    tensors = list(model.named_parameters()) + (list(model.named_buffers()) if wrap == "ddp" else [])
    ignored = set(getattr(model, "_ddp_params_and_buffers_to_ignore", ()) or ()) if wrap == "ddp" else set()
    # what DDP is told to ignore it never broadcasts nor reduces: a per-rank cache may differ (a review)
    mine = [(n, tuple(p.shape), str(p.dtype).replace("torch.", "")) for n, p in tensors if n not in ignored]
    everyone: list = [None] * dist.get_world_size()
    try:
        dist.all_gather_object(everyone, mine, group=_DECISIONS)
    except Exception as exc:   # a peer failed before it got here (its own error leads the report)
        err = ModelError(f"--wrap {wrap}: could not compare parameters with the other ranks: {one_line(exc, 160)}")
        err.follows_peer = True
        raise err from exc
    if all(theirs == everyone[0] for theirs in everyone):
        return
    tables = [dict((n, (s, d)) for n, s, d in theirs) for theirs in everyone]
    names = list(dict.fromkeys(n for t in tables for n in t))
    differ = [n for n in names if any(t.get(n) != tables[0].get(n) for t in tables)]

    def show(t, n):
        return "absent" if n not in t else f"{'x'.join(map(str, t[n][0])) or 'scalar'} {t[n][1]}"

    first = differ[0]
    what = "parameter(s)" if wrap != "ddp" else "parameter(s) or buffer(s)"
    raise ModelError(f"--wrap {wrap}: the ranks built different models: {len(differ)} {what} differ, first "
                     f"{first} (" + ", ".join(f"rank {r}: {show(t, first)}" for r, t in enumerate(tables)) + ")",
                     hint="every rank must build the same model to be wrapped; run without --wrap to see every "
                          "difference as rank-divergence findings")


def inner(wrapped):
    """The user's module inside a wrapper: DDP's `.module`; a model fully_shard sharded is its own module
    (its own attribute named `module`, if any, is the user's)."""
    from torch.nn.parallel import DistributedDataParallel

    return wrapped.module if isinstance(wrapped, DistributedDataParallel) else wrapped


def local_shard(t):
    """This rank's part of a DTensor (an FSDP-sharded parameter or gradient), with no collective; any
    other tensor (or None) as is."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def gathered(named: dict, device) -> dict:
    """{name: tensor or None} with every DTensor made whole, detached (under --wrap fsdp: parameters and
    gradients as every rank sees them after the reduce-scatter). One all-gather per DTensor, in the
    dict's order (the same on every rank); a tensor that is None on any rank is None on all, agreed
    first, so no rank waits in an all-gather its peers skip. Every rank must call it."""
    import torch

    names = list(named)
    missing = agree([named[n] is None for n in names], device) if names else []
    out = {}
    with torch.no_grad():
        for n, gone in zip(names, missing):
            t = named[n]
            out[n] = None if gone else whole(t)
    return out


def whole(t):
    """A DTensor's full value (an all-gather every rank must make), detached; a trainable parameter's stays
    marked trainable (what is judged reads it). Any other tensor as is."""
    if not hasattr(t, "full_tensor"):
        return t
    return t.full_tensor().detach().requires_grad_(t.requires_grad)


def unwrapped(model, work, why: str):
    """A plain local copy of `model` holding the state `work` (its DDP-wrapped or FSDP-sharded copy)
    trained: passes run on it make no collective, so a rank may take them whatever its peers do. Under
    FSDP the shards are gathered whole first: every rank must call it then."""
    from .train import train_copy

    plain = train_copy(model, why)
    state = inner(work).state_dict()
    if any(hasattr(t, "full_tensor") for t in state.values()):   # sharded: the same structure on every rank
        state = gathered(state, next(iter(state.values())).device)
    plain.load_state_dict(state)
    return plain


def _fully_shard(model, ranks: Ranks, device):
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
    except ImportError as exc:
        import torch

        raise UsageError(f"--wrap fsdp needs torch.distributed.fsdp.fully_shard (torch >= 2.6); this is torch {torch.__version__}",
                         hint="upgrade torch, or use --wrap ddp") from exc
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()})
    if len(dtypes) > 1:   # fully_shard at the root: one parameter group, all-gathered as one flat buffer
        raise UsageError(f"--wrap fsdp: FSDP needs one dtype per parameter group, and this model's parameters are "
                         f"{', '.join(dtypes)}", hint="use --wrap ddp, or give every parameter one dtype")
    mesh = init_device_mesh(device.type, (ranks.world_size,))
    try:
        fully_shard(model, mesh=mesh)
    except Exception as exc:
        raise ModelError(f"sharding the model with fully_shard failed: {one_line(exc)}") from exc
    return model
