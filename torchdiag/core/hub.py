"""`hf:NAME` (`gpt2`, `org/name`, `org/name@revision`): a Hugging Face Hub model found where `from_pretrained`
finds it offline, in the local cache (`HF_HUB_CACHE`, else `HF_HOME/hub`, else ~/.cache/huggingface/hub:
`models--org--name/refs/<revision>` names the commit, `snapshots/<commit>/` holds its files).

Nothing is fetched unless the caller asks: `--download config` fetches `config.json` alone (never weights)
with huggingface_hub into that same cache, so the model can be planned with random weights or on meta.
`HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`) refuses even that. The environment is read when a name is
resolved, not when a library is imported. Torch-free."""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

from ..errors import UsageError, one_line

DOWNLOADS = ("config",)          # what --download may fetch: config.json alone
# a Hub model id as huggingface_hub validates it (ORG/ NAME, word characters, '-' and '.'), then @REVISION
_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
NAME = re.compile(rf"^(?:{_PART}/)?{_PART}$")
REVISION = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]{0,199}$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
TRUE = {"1", "ON", "YES", "TRUE"}
NAME_FORM = "NAME or ORG/NAME (letters, digits, '-', '_', '.'), optionally @REVISION"


@dataclass(frozen=True)
class Snapshot:
    """A Hub model's files in the cache."""

    repo: str
    revision: str
    folder: str                  # snapshots/<commit>/
    commit: str
    downloaded: bool = False     # its config.json was fetched by this run (--download config)

    def describe(self) -> str:
        how = "config.json fetched by --download config into" if self.downloaded else "from"
        at = "" if self.revision == "main" else f" at {self.revision}"
        return f"{how} the Hugging Face cache ({self.repo}{at}, snapshot {self.commit[:8]})"


def split(text: str) -> tuple[str, str] | None:
    """(repo id, revision) when `text` is a Hub model name, else None."""
    repo, at, revision = text.partition("@")
    if not NAME.match(repo) or "--" in repo or ".." in repo or (at and not _revision_ok(revision)):
        return None
    return repo, revision if at else "main"


def _revision_ok(revision: str) -> bool:
    return bool(REVISION.match(revision)) and ".." not in revision and not revision.endswith("/")


def looks_like_path(text: str) -> bool:
    """A string only a path would be (`./x`, `/x`, `~/x`, `a/b/c`, `x/config.json`): no Hub name is meant."""
    return text.startswith((".", "/", "~")) or os.sep != "/" and os.sep in text or text.count("/") > 1 \
        or text.endswith(".json")


def cache_dir() -> str:
    """Where huggingface_hub keeps models, by the same variables in the same order, read now."""
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    hub = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return os.path.expandvars(os.path.expanduser(hub))


def shown(path: str) -> str:
    """A path as a person writes it: the home folder as ~."""
    home = os.path.expanduser("~")
    return "~" + path[len(home):] if home not in ("", "/", "~") and (path == home or path.startswith(home + os.sep)) else path


def offline() -> bool:
    env = os.environ
    return (env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or "").strip().upper() in TRUE


def resolve(text: str, download: str | None = None) -> Snapshot:
    """The cached snapshot of Hub name `text` that holds config.json; fetched first when `download` asks."""
    named = split(text)
    if named is None:
        raise UsageError(f"hf:{text}: no such folder or file, and not a Hub model name ({NAME_FORM})",
                         hint="give a local folder with config.json, or the name of a model in the Hugging Face cache")
    repo, revision = named
    cache = cache_dir()
    found = cached(repo, revision, cache)
    if found is not None and os.path.isfile(os.path.join(found.folder, "config.json")):
        return found
    if download != "config":
        raise _not_cached(text, repo, cache, found)
    if offline():
        raise UsageError(f"hf:{text}: --download config: HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set, so nothing is "
                         "fetched", hint=f"unset it to fetch config.json of {repo}, or download it where you are online")
    path = fetch_config(repo, revision, cache)
    folder = os.path.dirname(path)
    return Snapshot(repo, revision, folder, os.path.basename(folder), downloaded=True)


def precheck(text: str, download: str | None = None) -> None:
    """Before torch is imported: a malformed name, or (unless a download was asked for) a name the cache does
    not hold, is the error the full load would give. A file or folder of that name is left to the loader."""
    if os.path.exists(text) or looks_like_path(text):
        return
    if download is None:
        resolve(text)
    elif split(text) is None:
        resolve(text, download)   # raises: not a Hub name


def _not_cached(text: str, repo: str, cache: str, found: Snapshot | None) -> UsageError:
    revision = text.partition("@")[2] or "main"
    fetch = (f"--download config fetches its config.json alone (no weights: random weights, or --device meta); "
             f"or download the model once: hf download {repo}" + (f" --revision {revision}" if revision != "main" else ""))
    if found is not None:
        return UsageError(f"hf:{text}: the Hugging Face cache ({shown(cache)}) holds {repo} (snapshot {found.commit[:8]}) "
                          "but no config.json in it", hint=fetch)
    return UsageError(f"hf:{text} is no local folder and is not in the Hugging Face cache ({shown(cache)}); nothing was "
                      "downloaded", hint=fetch)


def cached(repo: str, revision: str, cache: str) -> Snapshot | None:
    """refs/<revision> → the commit, as huggingface_hub's try_to_load_from_cache reads it (a revision that is
    no ref is taken as a commit); its snapshots/<commit>/ folder, or None."""
    base = os.path.join(cache, "models--" + repo.replace("/", "--"))
    commit = revision
    ref = os.path.join(base, "refs", revision)
    if os.path.isfile(ref):
        try:
            with open(ref, encoding="utf-8") as f:
                commit = f.read(100).strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read {ref}: {one_line(exc)}", hint="the Hugging Face cache entry is damaged: "
                             f"delete {base} and download the model again") from exc
        if not COMMIT.match(commit):
            raise UsageError(f"{ref} names no commit (it holds {commit[:60]!r})",
                             hint=f"the Hugging Face cache entry is damaged: delete {base} and download the model again")
    folder = os.path.join(base, "snapshots", commit)
    if "/" in commit or not os.path.isdir(folder):
        return None
    return Snapshot(repo, revision, folder, commit)


def fetch_config(repo: str, revision: str, cache: str) -> str:
    """config.json of `repo` at `revision` into the cache with huggingface_hub (HF_ENDPOINT, HF_TOKEN as it reads
    them); its path. Every failure is one line (exit 2)."""
    try:
        import huggingface_hub
    except ImportError as exc:
        raise UsageError("huggingface_hub is not installed: pip install huggingface_hub  (or pip install 'torchdiag[hf]')",
                         hint="--download config fetches config.json with it") from exc
    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    quiet = _quiet_progress(huggingface_hub)
    log = logging.getLogger("huggingface_hub")
    level = log.level
    log.setLevel(logging.ERROR)   # its retry warnings: the run's one error line says what failed
    try:
        return huggingface_hub.hf_hub_download(repo, "config.json", revision=revision, cache_dir=cache,
                                               endpoint=endpoint)
    except Exception as exc:   # network, HTTP status, disk: each one line, never a traceback
        raise _fetch_error(exc, repo, revision, endpoint) from exc
    finally:
        log.setLevel(level)
        quiet()


def _fetch_error(exc: BaseException, repo: str, revision: str, endpoint: str) -> UsageError:
    kinds = {c.__name__ for c in type(exc).__mro__}
    where = f"{endpoint}/{repo}"
    if "LocalEntryNotFoundError" in kinds:   # the Hub was not reached (and the cache has no copy): why not
        exc = exc.__cause__ or exc
        kinds = set()
    if "GatedRepoError" in kinds:
        return UsageError(f"hf:{repo}: {where} is gated: its config.json needs you to accept its terms",
                          hint="accept them on the model's page, then log in (hf auth login) or set HF_TOKEN")
    if "RepositoryNotFoundError" in kinds:
        return UsageError(f"hf:{repo}: {endpoint} has no model named {repo} (or it is private)",
                          hint="check the name; for a private model log in (hf auth login) or set HF_TOKEN")
    if "RevisionNotFoundError" in kinds:
        return UsageError(f"hf:{repo}: {where} has no revision '{revision}'", hint="name a branch, tag or commit it has")
    if kinds & {"EntryNotFoundError", "RemoteEntryNotFoundError"}:
        return UsageError(f"hf:{repo}: {where} has no config.json", hint="torchdiag builds Hugging Face models from "
                          "their config.json; this repository is not a transformers model")
    return UsageError(f"hf:{repo}: --download config could not fetch config.json from {endpoint}: {one_line(exc)}",
                      hint="check the network (and HF_ENDPOINT if set); without --download torchdiag reads only "
                           "the local cache")


def _quiet_progress(huggingface_hub):
    """No progress bar for one small file (stderr stays the run's own); returns what puts it back."""
    utils = getattr(huggingface_hub, "utils", None)
    disable, enable = getattr(utils, "disable_progress_bars", None), getattr(utils, "enable_progress_bars", None)
    were_off = getattr(utils, "are_progress_bars_disabled", lambda: True)()
    if were_off or disable is None or enable is None:
        return lambda: None
    disable()
    return enable
