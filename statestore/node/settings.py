"""A node's settings, written once: the table every source of them is generated from.

``SETTINGS`` is one row per setting (name, kind, default, help, unit, the NodeConfig fields it
sets). From it come the ``statestore node`` flags (``add_node_arguments``), the keys of a TOML
config file (``statestore node --config node.toml``: the long flag's name without the dashes)
and the environment variables (``STATESTORE_`` and the name in capitals, ``-`` as ``_``).
``resolve`` merges them, **flag > environment > file > default**, into a ``NodeConfig`` (the
runtime type; other code reads its fields) and says where each value came from, so a bad
value names the setting and its source (``--memory-budget``, ``STATESTORE_MEMORY_BUDGET`` or
``node.toml: memory-budget``).

Environment variables: every ``STATESTORE_<SETTING>`` is read. The clients' and scripts'
variables (``NOT_SETTINGS``: ``STATESTORE_TOKEN``, ``STATESTORE_TLS_CA``, ...) are left alone,
and so is any other variable, except one whose name is a near miss of a setting's (a typo
such as ``STATESTORE_MEMORY_BUDGT``): that is refused, naming the setting it resembles.
``--tls-ca`` is the one setting not read from the environment: ``STATESTORE_TLS_CA`` is the
clients' CA (docs/security.md), and a shell set up for clients must not half-configure a
node's TLS.

Importing this module loads no server, storage or DHT code (the CLI parses node flags on a
client-only install).
"""

from __future__ import annotations

import argparse
import difflib
import math
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from statestore.core.address import parse_address, parse_seeds
from statestore.core.errors import InvalidAddress
from statestore.core.formats import CHUNK_FORMAT
from statestore.core.placement import DEFAULT_VNODES
from statestore.node.config import NodeConfig

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "HELP_EPILOG",
    "INTERNAL_FIELDS",
    "NOT_SETTINGS",
    "SETTINGS",
    "Resolved",
    "Setting",
    "SettingError",
    "add_node_arguments",
    "env_name",
    "node_env_names",
    "read_config_file",
    "read_environment",
    "resolve",
    "show_default",
]

ENV_PREFIX = "STATESTORE_"
CONFIG_ENV = "STATESTORE_CONFIG"  # the config file, when --config is not given

# STATESTORE_ variables that are no node setting: the clients', the CLI's and the scripts'.
# They are never read by a node nor refused (the names a near-miss check might confuse).
NOT_SETTINGS = frozenset(
    {
        "STATESTORE_TOKEN",  # client bearer token (SDK, CLI)
        "STATESTORE_TOKEN_FILE",  # ... read from a file (CLI, Spark)
        "STATESTORE_TLS_CA",  # the CA clients verify the ring against (not the node's --tls-ca)
        "STATESTORE_VENV",  # ./run
        "STATESTORE_TEST_WORKERS",  # ./run test
        "STATESTORE_CACHE",
        "STATESTORE_REWRITE",
        "STATESTORE_DELTA_ROWS",
        "STATESTORE_INITIAL_ROWS",
        "STATESTORE_PARTITION_LOG",
        CONFIG_ENV,
    }
)

# NodeConfig fields no flag, file key or variable sets: tests and embedded nodes set them
# in-process (bench/, the simulator), and their defaults are what a ring runs with.
INTERNAL_FIELDS: dict[str, str] = {
    "repair_interval": "seconds between repair passes; tests shorten it in-process",
    "compact_interval": "seconds between compaction passes; tests shorten it in-process",
    "dht_port": "the DHT's UDP port: the HTTP port's number (tests pick another)",
    "header_timeout": "slow-client limits, tuned in-process by the hostile-input tests",
    "body_timeout": "slow-client limits, tuned in-process by the hostile-input tests",
}

Kind = Literal["text", "int", "number", "bool", "address", "list"]
FlagStyle = Literal["value", "true", "optional"]


class SettingError(ValueError):
    """A bad or unknown setting; the message names it and its source."""


def _fail(text: str, what: str) -> ValueError:
    return ValueError(f"{text!r} is not {what}")


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise _fail(text, "a positive integer")
    return int(text)


def _chunk_format(text: str) -> int:
    if text not in ("1", "2", "3"):
        raise _fail(
            text, "a chunk format: 1 (whole chunks), 2 (blocked) or 3 (whole snapshots named w)"
        )
    return int(text)


def _number(text: str, *, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise _fail(text, "a positive number" if positive else "a number >= 0")
    return value


def _positive_number(text: str) -> float:
    return _number(text, positive=True)


def _non_negative(text: str) -> float:
    return _number(text, positive=False)


def _non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise _fail(text, "an integer >= 0")
    return int(text)


def _fraction(text: str) -> float:
    value = _number(text, positive=False)
    if value >= 1:
        raise _fail(text, "a share in [0, 1)")
    return value


def _listen(text: str) -> tuple[str, int]:
    try:
        return parse_address(text, bind=True)
    except InvalidAddress as exc:
        raise ValueError(str(exc)) from exc


def _advertise(text: str) -> tuple[str, int]:
    try:
        return parse_address(text, what="advertised address", bind=True)
    except InvalidAddress as exc:
        raise ValueError(str(exc)) from exc


def _seeds(text: str) -> list[str]:
    try:
        return parse_seeds(text)
    except InvalidAddress as exc:
        raise ValueError(str(exc)) from exc


def _text(text: str) -> str:
    return text


def _log_format(text: str) -> str:
    if text.lower() not in ("text", "json"):
        raise _fail(text, "a log format (text or json)")
    return text.lower()


def _log_level(text: str) -> str:
    if text.upper() not in ("DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL", "FATAL"):
        raise _fail(text, "a log level (DEBUG, INFO, WARNING, ERROR or CRITICAL)")
    return text.upper()


@dataclass(frozen=True)
class Setting:
    """One node setting. ``name`` is the long flag without its dashes, the config file's key
    and (``env_name``) the environment variable's stem. ``fields`` are the NodeConfig fields it
    sets (none: a CLI-only setting such as ``log-level``); ``to_config`` maps its value to them
    when that is not ``{fields[0]: value}``."""

    name: str
    kind: Kind
    default: Any
    help: str
    fields: tuple[str, ...]
    parse: Callable[[str], Any] = _text  # text (a flag's or a variable's) -> value
    metavar: str | None = None
    unit: str | None = None
    flag: FlagStyle = "value"  # "true": --name sets True; "optional": --name / --no-name
    to_config: Callable[[Any], dict[str, Any]] | None = None
    env: bool = True  # read from STATESTORE_<NAME>
    required: bool = False

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def option(self) -> str:
        return f"--{self.name}"

    def config_values(self, value: Any) -> dict[str, Any]:
        if self.to_config is not None:
            return self.to_config(value)
        return {self.fields[0]: value} if self.fields else {}


def env_name(setting: Setting) -> str:
    return ENV_PREFIX + setting.name.upper().replace("-", "_")


def _listen_fields(v: tuple[str, int]) -> dict[str, Any]:
    return {"host": v[0], "port": v[1]}


def _advertise_field(v: tuple[str, int] | None) -> dict[str, Any]:
    return {"advertise": f"{v[0]}:{v[1]}" if v else ""}


MiB = 2**20

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "listen",
        "address",
        ("127.0.0.1", 7400),
        "address the HTTP API listens on (port 0: any); the DHT takes the same number on UDP "
        "when it is free, else any (the first stdout line names it)",
        ("host", "port"),
        _listen,
        "HOST:PORT",
        to_config=_listen_fields,
    ),
    Setting(
        "data-dir",
        "text",
        None,
        "node id and data live here (required)",
        ("data_dir",),
        metavar="DIR",
        required=True,
    ),
    Setting(
        "seeds",
        "list",
        [],
        "running nodes to join through (none: the first node of a ring)",
        ("seeds",),
        _seeds,
        "HOST:PORT,...",
    ),
    Setting("replicas", "int", 3, "copies of every chunk (R)", ("replicas",), _positive_int, "R"),
    Setting(
        "write-quorum",
        "int",
        None,
        "copies a commit waits for (W; default R//2+1)",
        ("write_quorum",),
        _positive_int,
        "W",
    ),
    Setting(
        "vnodes",
        "int",
        DEFAULT_VNODES,
        "virtual nodes (tokens) per node on the ring",
        ("vnodes",),
        _positive_int,
        "N",
    ),
    Setting("zone", "text", "", "failure zone: replicas spread over zones", ("zone",), metavar="Z"),
    Setting(
        "advertise",
        "address",
        None,
        "address other nodes and clients use (default: --listen)",
        ("advertise",),
        _advertise,
        "HOST:PORT",
        to_config=_advertise_field,
    ),
    Setting(
        "storage",
        "text",
        "",
        "memory:// or lmdb:///dir (default: LMDB in the data dir)",
        ("storage",),
        metavar="URL",
    ),
    Setting(
        "max-body",
        "int",
        64 * MiB,
        "largest request body",
        ("max_body",),
        _positive_int,
        "BYTES",
        "bytes",
    ),
    Setting(
        "chunk-format",
        "int",
        CHUNK_FORMAT,
        "the newest chunk layout writers may use on this ring: 3 blocked, a writer's whole "
        "snapshot's chunks named w (thinning never drops them); 2 blocked (point reads fetch "
        "one block), which builds without w names read; 1 whole, which SDKs and nodes before "
        "0.3.0 read; the ring writes a layout only when every node allows it",
        ("chunk_format",),
        _chunk_format,
        "N",
    ),
    Setting(
        "max-chunk",
        "int",
        256 * MiB,
        "largest decompressed chunk accepted",
        ("max_chunk",),
        _positive_int,
        "BYTES",
        "bytes",
    ),
    Setting(
        "lookup-cache",
        "int",
        32 * MiB,
        "bytes of chunk indexes and decoded blocks kept for point reads and lookups",
        ("lookup_cache",),
        _non_negative_int,
        "BYTES",
        "bytes",
    ),
    Setting(
        "max-commit",
        "int",
        256 * MiB,
        "largest coordinator commit body (it holds 3x that while it is chunked)",
        ("max_commit",),
        _positive_int,
        "BYTES",
        "bytes",
    ),
    Setting(
        "memory-budget",
        "int",
        1024 * MiB,
        "bytes that requests in flight may hold in all; more wait, then get 429",
        ("memory_budget",),
        _positive_int,
        "BYTES",
        "bytes",
    ),
    Setting(
        "scrub-mbps",
        "number",
        8.0,
        "MB/s of held chunks and manifests re-verified at rest (0: no scrub)",
        ("scrub_mbps",),
        _non_negative,
        "MB/S",
        "MB/s",
    ),
    Setting(
        "scrub-interval",
        "number",
        3600.0,
        "seconds between scrub passes",
        ("scrub_interval",),
        _non_negative,
        "S",
        "s",
    ),
    Setting(
        "reclaim-at",
        "number",
        0.25,
        "compact the storage file when this share of it is free pages (0: never)",
        ("reclaim_at",),
        _fraction,
        "SHARE",
        None,
    ),
    Setting(
        "reclaim-min",
        "int",
        64 * MiB,
        "and when at least this many bytes are free",
        ("reclaim_min",),
        _non_negative_int,
        "BYTES",
        "bytes",
    ),
    Setting(
        "min-free",
        "int",
        64 * MiB,
        "free disk bytes under the data dir below which the node takes no new data "
        "(read-only, 507) until space returns; compaction keeps this much free too (0: none)",
        ("min_free_bytes",),
        _non_negative_int,
        "BYTES",
        "bytes",
    ),
    Setting(
        "hint-ttl",
        "number",
        3600.0,
        "seconds an undecidable hint is kept before it is dropped",
        ("hint_ttl",),
        _positive_number,
        "S",
        "s",
    ),
    Setting(
        "snapshot-every",
        "int",
        10,
        "deltas after which the store's leader folds a snapshot",
        ("snapshot_every",),
        _positive_int,
        "N",
    ),
    Setting(
        "rebase-at",
        "number",
        0.0,
        "and only once the deltas above the last snapshot weigh this share of it, or number "
        "10 x N (0: every N)",
        ("rebase_at",),
        _non_negative,
        "SHARE",
        None,
    ),
    Setting(
        "thin-snapshots",
        "int",
        50,
        "keep, of the snapshots above the retention floor, the newest and those at "
        "multiples of N (the rungs the floor climbs by, written when it needs them; at most "
        "half the versions the store retains), and drop the others (0: draw no new line; a "
        "line a store already holds still binds its folds)",
        ("thin_snapshots",),
        _non_negative_int,
        "N",
    ),
    Setting(
        "retain",
        "int",
        100,
        "versions kept per store",
        ("retain_versions",),
        _positive_int,
        "K",
    ),
    Setting(
        "gossip-interval",
        "number",
        0.5,
        "seconds between two heartbeats to the other members",
        ("gossip_interval",),
        _positive_number,
        "S",
        "s",
    ),
    Setting(
        "suspect-after",
        "number",
        2.0,
        "seconds of silence after which a member is suspect",
        ("suspect_after",),
        _positive_number,
        "S",
        "s",
    ),
    Setting(
        "down-after",
        "number",
        5.0,
        "seconds of silence after which a member is down and its copies are re-made",
        ("down_after",),
        _positive_number,
        "S",
        "s",
    ),
    Setting(
        "inject-delay",
        "number",
        0.0,
        "testing only: seconds of delay added to every chunk read",
        ("inject_delay",),
        _non_negative,
        "S",
        "s",
    ),
    Setting(
        "no-dht",
        "bool",
        False,
        "gossip through seeds only (no Kademlia DHT)",
        ("dht",),
        flag="true",
        to_config=lambda v: {"dht": not v},
    ),
    Setting(
        "cluster-secret-file",
        "text",
        "",
        "node identity: the same secret file on every node; internal requests are signed "
        "with it and unsigned ones refused (docs/security.md)",
        ("cluster_secret_file",),
        metavar="F",
    ),
    Setting(
        "auth-file",
        "text",
        "",
        'client tokens: JSON {"TOKEN": {"queries": ["q1", "etl-*"], "rights": '
        '["read", "write", "admin"]}}, re-read when it changes (docs/security.md)',
        ("auth_file",),
        metavar="F",
    ),
    Setting(
        "quota-file",
        "text",
        "",
        'per-query storage quotas: JSON {"q1": {"max_bytes": N}, "etl-*": {...}}, the '
        "bytes each query may hold on this node, re-read when it changes (docs/security.md)",
        ("quota_file",),
        metavar="F",
    ),
    Setting(
        "tls-cert",
        "text",
        "",
        "serve HTTPS only with this PEM certificate (it must name the advertised host)",
        ("tls_cert",),
        metavar="F",
    ),
    Setting("tls-key", "text", "", "the certificate's private key", ("tls_key",), metavar="F"),
    Setting(
        "tls-ca",
        "text",
        "",
        "PEM CA the nodes this one calls are verified against (default: the system's; not "
        "read from STATESTORE_TLS_CA, the clients' variable)",
        ("tls_ca",),
        metavar="F",
        env=False,
    ),
    Setting(
        "join",
        "bool",
        False,
        "join a running ring with hand-over: take tokens as pending, stream what this node "
        "will own, then serve reads (docs/operations.md)",
        ("join",),
        flag="true",
    ),
    Setting(
        "stream-mbps",
        "number",
        25.0,
        "budget of a join or decommission hand-over on this node",
        ("stream_mbps",),
        _positive_number,
        "MB/S",
        "MB/s",
    ),
    Setting(
        "switch-interval-ms",
        "number",
        1.0,
        "how long a worker thread may hold the interpreter while the event loop waits for "
        "it (Python's own is 5: docs/operations.md)",
        ("switch_interval_ms",),
        _positive_number,
        "MS",
        "ms",
    ),
    Setting(
        "gc-freeze",
        "bool",
        True,
        "once started, freeze what the node holds out of the garbage collector's full "
        "passes: a tenth of the time in them (docs/operations.md)",
        ("gc_freeze",),
        flag="optional",
    ),
    Setting(
        "no-repair-digests",
        "bool",
        False,
        "list every item to peers in repair and hand-over instead of comparing token ranges "
        "by digest first (to measure what digests save: docs/reliability.md)",
        ("repair_digests",),
        flag="true",
        to_config=lambda v: {"repair_digests": not v},
    ),
    Setting(
        "auto-rebalance",
        "number",
        0.0,
        "move tokens on its own when max/mean bytes held passes RATIO, e.g. 1.25 (the live "
        "member with the lowest id decides; 0: off; docs/operations.md)",
        ("auto_rebalance",),
        _non_negative,
        "RATIO",
    ),
    Setting(
        "rebalance-interval",
        "number",
        60.0,
        "seconds between two checks of --auto-rebalance",
        ("rebalance_interval",),
        _positive_number,
        "S",
        "s",
    ),
    Setting(
        "drain-on-stop",
        "bool",
        False,
        "on SIGTERM, decommission this node (hand every copy to its next owners) before "
        "exiting; a second SIGTERM or SIGINT stops at once (docs/operations.md)",
        ("drain_on_stop",),
        flag="true",
    ),
    Setting(
        "drain-timeout",
        "number",
        600.0,
        "seconds a --drain-on-stop drain may take before the node exits non-zero",
        ("drain_timeout",),
        _positive_number,
        "S",
        "s",
    ),
    Setting(
        "replace",
        "text",
        "",
        "take over the tokens of the dead node ID: stream what it owned from the surviving "
        "replicas, then serve (needs an empty --data-dir; docs/operations.md)",
        ("replace",),
        metavar="ID",
    ),
    Setting(
        "log-level", "text", "WARNING", "DEBUG, INFO, WARNING or ERROR", (), _log_level, "LEVEL"
    ),
    Setting(
        "log-format",
        "text",
        "text",
        "the logs on stderr: text (one line each) or json (one object per line: time, level, "
        "logger, message, exc_info; docs/operations.md, Logs)",
        (),
        _log_format,
        "FORMAT",
    ),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def node_env_names() -> frozenset[str]:
    """Every environment variable a node reads as a setting (``STATESTORE_NO_GC_FREEZE``, the
    negation of an ``--x/--no-x`` setting, included), and the config file's."""
    names = {env_name(s) for s in SETTINGS if s.env}
    names |= {ENV_PREFIX + "NO_" + s.dest.upper() for s in SETTINGS if s.flag == "optional"}
    return frozenset(names | {CONFIG_ENV})


# -- flags ----------------------------------------------------------------------------------
def _given(namespace: argparse.Namespace) -> set[str]:
    given: set[str] | None = getattr(namespace, "given_settings", None)
    if given is None:
        given = set()
        namespace.given_settings = given
    return given


class _Value(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        _given(namespace).add(self.dest)


class _True(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, True)
        _given(namespace).add(self.dest)


class _Optional(argparse.BooleanOptionalAction):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        super().__call__(parser, namespace, values, option_string)
        _given(namespace).add(self.dest)


def _flag_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:  # argparse prints "argument --x: <message>", exit 2
            raise argparse.ArgumentTypeError(str(exc)) from exc

    convert.__name__ = parse.__name__.strip("_")
    return convert


def show_default(s: Setting) -> str:
    """The default as the help and the docs show it ('' when there is nothing to say)."""
    v = s.default
    if s.flag == "optional":
        return "on" if v else "off"
    if v is None or v == "" or v == [] or s.kind == "bool":
        return ""
    if isinstance(v, tuple):
        return f"{v[0]}:{v[1]}"
    if s.unit == "bytes" and isinstance(v, int) and v % MiB == 0:
        return f"{v} = {v // MiB} MiB"
    return f"{v:g}" if isinstance(v, float) else str(v)


HELP_EPILOG = (
    "Every setting can also come from the environment, as STATESTORE_ and the flag's name "
    "in capitals with - as _ (STATESTORE_DATA_DIR=/data, STATESTORE_SEEDS=a:7400,b:7400, "
    "STATESTORE_NO_DHT=1, STATESTORE_GC_FREEZE=0; --tls-ca excepted), or from a TOML file "
    '(--config, or STATESTORE_CONFIG) whose keys are the flags\' names: data-dir = "/data", '
    'seeds = ["a:7400"], no-dht = true. Precedence: flag > environment > file > default. '
    "Reference: docs/cli.md."
)


def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``statestore node`` flags, one per row of ``SETTINGS`` (and ``--config``). A
    flag not given keeps the table's default in the namespace; ``given_settings`` lists the
    ones that were, for ``resolve``."""
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE.toml",
        help="read settings from this TOML file (keys: the flags' names, e.g. data-dir = "
        '"/data"); flags and STATESTORE_ variables override it (default: $STATESTORE_CONFIG)',
    )
    for s in SETTINGS:
        shown = show_default(s)
        text = s.help + (f" (default: {shown})" if shown and s.flag != "optional" else "")
        if s.flag == "true":
            parser.add_argument(s.option, action=_True, default=s.default, help=text)
        elif s.flag == "optional":
            parser.add_argument(
                s.option, action=_Optional, default=s.default, help=f"{s.help} (default: {shown})"
            )
        else:
            parser.add_argument(
                s.option,
                action=_Value,
                type=_flag_type(s.parse),
                default=s.default,
                metavar=s.metavar,
                help=text,
            )


# -- environment and file ---------------------------------------------------------------------
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _bool_text(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise _fail(text, "a boolean (1, true, yes, on or 0, false, no, off)")


def _from_env(s: Setting, text: str) -> Any:
    if s.kind == "bool":
        return _bool_text(text)
    return s.parse(text)


_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def _type_name(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _from_file(s: Setting, value: object) -> Any:
    expected = {
        "text": "a string",
        "address": 'a string "HOST:PORT"',
        "int": "an integer",
        "number": "a number",
        "bool": "true or false",
        "list": 'an array of strings ["HOST:PORT", ...]',
    }[s.kind]
    wrong = ValueError(f"expected {expected}, got {_type_name(value)} ({value!r:.60})")
    if s.kind == "bool":
        if not isinstance(value, bool):
            raise wrong
        return value
    if s.kind == "list":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise wrong
        return s.parse(",".join(value)) if value else []
    if s.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong
        return s.parse(str(value))
    if s.kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise wrong
        return s.parse(repr(float(value)))
    if not isinstance(value, str):
        raise wrong
    return s.parse(value)


def _lookup(key: str) -> tuple[Setting, bool] | None:
    """The setting a config key or variable stem names, and whether it is the negated
    ``no-`` form of an ``--x/--no-x`` setting."""
    if key in BY_NAME:
        return BY_NAME[key], False
    if key.startswith("no-") and key[3:] in BY_NAME and BY_NAME[key[3:]].flag == "optional":
        return BY_NAME[key[3:]], True
    return None


def _suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _file_keys() -> list[str]:
    keys = [s.name for s in SETTINGS]
    return keys + ["no-" + s.name for s in SETTINGS if s.flag == "optional"]


def read_config_file(path: str) -> dict[str, tuple[Any, str]]:
    """``{setting name: (value, source)}`` from a TOML file; SettingError names the file,
    and the key, for an unreadable file, bad TOML, an unknown key or a bad value."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise SettingError(f"--config {path}: cannot read it: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SettingError(f"{path}: not valid TOML: {exc}") from exc
    out: dict[str, tuple[Any, str]] = {}
    for key, raw in doc.items():
        source = f"{path}: {key}"
        found = _lookup(key)
        if found is None:
            by_field = {f.replace("_", "-"): s.name for s in SETTINGS for f in s.fields}
            named = by_field.get(key.replace("_", "-"))  # a NodeConfig field: retain-versions
            hint = f" (did you mean {named}?)" if named else _suggest(key, _file_keys())
            raise SettingError(
                f"{source}: no such node setting{hint}; the keys are "
                "the long flags' names without the dashes (statestore node --help)"
            )
        s, negated = found
        try:
            value = _from_file(s, raw)
        except ValueError as exc:
            raise SettingError(f"{source}: {exc}") from exc
        if s.name in out and out[s.name][0] != (not value if negated else value):
            raise SettingError(f"{source} contradicts {out[s.name][1]}")
        out[s.name] = (not value if negated else value, source)
    return out


def _env_stems() -> dict[str, tuple[Setting, bool]]:
    stems = {}
    for key in _file_keys():
        found = _lookup(key)
        assert found is not None
        if found[0].env:
            stems[ENV_PREFIX + key.upper().replace("-", "_")] = found
    return stems


def read_environment(environ: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
    """``{setting name: (value, variable)}`` from ``STATESTORE_*`` variables (an empty one
    counts as unset). SettingError for a bad value, or for an unknown variable whose name is
    a near miss of a setting's."""
    stems = _env_stems()
    out: dict[str, tuple[Any, str]] = {}
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX) or var in NOT_SETTINGS:
            continue
        text = environ[var]
        if var not in stems:
            close = difflib.get_close_matches(
                var[len(ENV_PREFIX) :], [v[len(ENV_PREFIX) :] for v in stems], n=1, cutoff=0.8
            )
            if close:
                raise SettingError(
                    f"{var} is no node setting (did you mean {ENV_PREFIX}{close[0]}?); unset it "
                    "or fix its name"
                )
            continue
        if not text.strip():
            continue
        s, negated = stems[var]
        try:
            value = _from_env(s, text)
        except ValueError as exc:
            raise SettingError(f"{var}: {exc}") from exc
        if negated:
            value = not value
        if s.name in out and out[s.name][0] != value:
            raise SettingError(f"{var} contradicts {out[s.name][1]}")
        out[s.name] = (value, var)
    return out


# -- merging ----------------------------------------------------------------------------------
@dataclass
class Resolved:
    config: NodeConfig
    log_level: str
    values: dict[str, Any]  # setting name -> value
    sources: dict[str, str]  # setting name -> "--x", "STATESTORE_X", "FILE: x" or "default"
    log_format: str = "text"  # "text" or "json" (cli/node.py sets up the logging)


def _annotate(message: str, sources: Mapping[str, str]) -> str:
    """A NodeConfig check names flags (``--memory-budget``); say where the ones that did not
    come from a flag were set."""
    notes = []
    for name in dict.fromkeys(re.findall(r"--([a-z][a-z-]*[a-z])", message)):
        source = sources.get(name, "")
        if source and source != "default" and not source.startswith("--"):
            notes.append(f"--{name} is from {source}")
    return message + (f" ({'; '.join(notes)})" if notes else "")


def resolve(args: argparse.Namespace, environ: Mapping[str, str]) -> Resolved:
    """The node's settings from its flags (``args``, parsed by a parser that
    ``add_node_arguments`` built), ``environ`` and the config file: flag > environment >
    file > default. Raises SettingError naming the setting and its source."""
    values: dict[str, Any] = {s.name: s.default for s in SETTINGS}
    sources = dict.fromkeys(values, "default")
    path = getattr(args, "config", None) or environ.get(CONFIG_ENV) or None
    layers = [read_config_file(path)] if path else []
    layers.append(read_environment(environ))
    for layer in layers:
        for name, (value, source) in layer.items():
            values[name], sources[name] = value, source
    for dest in getattr(args, "given_settings", ()):
        s = BY_NAME[dest.replace("_", "-")]
        values[s.name], sources[s.name] = getattr(args, dest), s.option
    for s in SETTINGS:
        if s.required and values[s.name] is None:
            raise SettingError(
                f"{s.option} is required: give it as a flag, as {env_name(s)}, or as "
                f"{s.name} in a --config file"
            )
    kwargs: dict[str, Any] = {}
    for s in SETTINGS:
        kwargs.update(s.config_values(values[s.name]))
    if kwargs["write_quorum"] is None:
        kwargs["write_quorum"] = kwargs["replicas"] // 2 + 1
    try:
        config = NodeConfig(**kwargs)
    except ValueError as exc:
        raise SettingError(_annotate(str(exc), sources)) from exc
    return Resolved(config, str(values["log-level"]), values, sources, str(values["log-format"]))
