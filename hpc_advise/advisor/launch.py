"""Turn a candidate configuration into the exact ``python -m sglang.launch_server`` command, check it
with SGLang's own argument parser, and replace this process with it.

Flag names are SGLang 0.5.23's (``sglang/srt/arg_groups/fields``): ``--tp-size`` counts every GPU of a
replica, ``--attn-dp-size`` is attention data parallelism inside it (the old ``--enable-dp-attention
--dp-size`` spelling is deprecated there), ``--dp-size`` is the number of replicas behind SGLang's
router, ``--ep-size`` expert parallelism. Our decode attention is selected with
``--decode-attention-backend hpc_advise --page-size 64`` (prefill stays on fa3). SGLang loads every
installed plugin unless ``SGLANG_PLUGINS`` lists some, so ``SGLANG_PLUGINS`` is only extended, never set
to us alone (:func:`plugins_env`). HPC-Ops' MoE gets ``--disable-shared-experts-fusion``; a profile that
plans FP8 over a bf16 checkpoint (Hy3) gets SGLang's online ``--quantization fp8``; a config.json stands
for its folder. Extra arguments that contradict the plan are refused unless ``--force``; ``--use-ray``
with our backends is refused (Ray workers never load plugins). With our backends, an fp32 MoE gate (Hy3's)
gets our router GEMM (``HPC_ADVISE_ROUTER_GEMM=1``, :func:`router_env`) where the shipped layer steps
measured the decode step faster with it.

Beyond one node (``node_gpus``, the GPU profile's ``gpus_per_node``) the deployment becomes several
SGLang servers (``node_plan``), since SGLang 0.5.23 refuses data-parallel replicas across nodes
(``--dp-size`` with ``--nnodes`` > 1): a replica whose tensor-parallel group spans k nodes is one server
launched on each of them with ``--nnodes k --node-rank i --dist-init-addr HOST:PORT`` (node 0's
address; ``DIST_INIT_PLACEHOLDER`` until the user gives one), smaller replicas run one server per node
(``--dp-size`` = replicas per node) behind a router. ``LaunchCommand.notes`` say so.

Validation runs in a child Python: SGLang's plugin loader, its parser, then its server-args resolution,
where our plugin's resolution hooks apply the support rules (``hpc_advise.rules``); the real cause is
reported. torch stays out of this process; the launch itself is ``os.execvpe`` so signals and the exit
code belong to SGLang.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import click

from hpc_advise import measured, rules
from hpc_advise.advisor.candidates import Candidate, setup_of

PLUGIN_NAME = rules.NAME
PREFILL_BACKEND_FOR_OURS = rules.PREFILL_FOR_OURS
FORCE_FLAG = "--force"  # ours, among the extra arguments: keep extra flags that contradict the plan
# SGLang's aliases of the flags we print (sglang/srt/arg_groups/fields: Arg(aliases=...))
ALIASES = {
    "--model": "--model-path",
    "--tensor-parallel-size": "--tp-size",
    "--data-parallel-size": "--dp-size",
    "--expert-parallel-size": "--ep-size",
}


class LaunchError(click.ClickException):
    """The command cannot be built as asked (one line saying what to do; the CLI prints it, exit 1)."""


@dataclass
class LaunchCommand:
    argv: list[str]
    env: dict[str, str]  # variables to add to the environment
    planned: list[str] = field(default_factory=list)  # argv before the user's extra arguments
    forced: bool = False  # extra arguments may override the plan (--force)
    notes: list[str] = field(default_factory=list)  # how to run it on several nodes (``node_plan``)

    def shell(self) -> str:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = " ".join(shlex.quote(a) for a in self.argv)
        return f"{prefix} {cmd}".strip()


DIST_INIT_PLACEHOLDER = "NODE0_HOST:5000"  # printed until --dist-init-addr names node 0's address


@dataclass(frozen=True)
class NodePlan:
    """How a candidate maps onto nodes: ``servers`` SGLang servers, each over ``nnodes`` nodes,
    each holding ``dp`` replicas (``--dp-size``)."""

    servers: int
    nnodes: int
    dp: int


def node_plan(c: Candidate, node_gpus: int | None) -> NodePlan:
    """The servers ``c`` needs on nodes of ``node_gpus`` GPUs (None: one node holds it all). Assumes
    ``candidates.node_layout_reason`` passed: a replica spans whole nodes or tiles them."""
    if not node_gpus or c.n_gpus <= node_gpus:
        return NodePlan(1, 1, c.replicas)
    if c.tp >= node_gpus:
        return NodePlan(c.replicas, c.tp // node_gpus, 1)
    per_node = node_gpus // c.tp
    return NodePlan(-(-c.replicas // per_node), 1, min(per_node, c.replicas))


def _node_notes(plan: NodePlan, node_gpus: int, dist_init_addr: str | None) -> list[str]:
    if plan.nnodes > 1:
        where = "node 0's address" + ("" if dist_init_addr else f" in place of {DIST_INIT_PLACEHOLDER}")
        text = (
            f"run this on each of the {plan.nnodes} nodes of a replica with --node-rank 0 to {plan.nnodes - 1} "
            f"and --dist-init-addr {where}"
        )
        if plan.servers > 1:
            text += f"; {plan.servers} such replicas ({plan.servers * plan.nnodes} nodes) behind a router"
        return [text]
    if plan.servers > 1:
        return [
            f"one server per {node_gpus}-GPU node ({plan.servers} nodes), this command on each, behind a "
            f"router (e.g. python -m sglang_router.launch_router --worker-urls http://NODE:30000 ...)"
        ]
    return []


def plugins_env(environ: dict | None = None) -> dict[str, str]:
    """The variables our plugin needs. SGLang loads every installed plugin when ``SGLANG_PLUGINS`` is
    unset or empty and only the listed ones otherwise (``sglang.srt.plugins.load_plugins_by_group``):
    so nothing is set unless the environment already holds a list without us, which then gets us added
    (``SGLANG_PLUGINS=hpc_advise`` alone would turn every other plugin off)."""
    env = os.environ if environ is None else environ
    listed = [x.strip() for x in env.get("SGLANG_PLUGINS", "").split(",") if x.strip()]
    if not listed or PLUGIN_NAME in listed:
        return {}
    return {"SGLANG_PLUGINS": ",".join([*listed, PLUGIN_NAME])}


def model_path_arg(model_path: str, model=None) -> str:
    """What SGLang's ``--model-path`` takes: a config.json (or any .json file, also the ``source`` of a
    profile read from one) stands for its folder, a local folder for its absolute path."""
    source = Path(str(getattr(model, "source", "") or "")).expanduser()
    if source.suffix == ".json" and source.is_file() and source.name == "config.json":
        return str(source.resolve().parent)
    p = Path(model_path).expanduser()
    if p.suffix == ".json" and p.is_file():
        return str(p.resolve().parent)
    if p.is_dir():
        return str(p.resolve())
    return model_path


def _profile_for(model_path: str):
    """The model profile SGLang's ``--model-path`` names (shipped key, alias, HF id or config.json)."""
    from hpc_advise.profiles import ModelConfigError, ProfileNotFound, get_model

    try:
        return get_model(model_path)
    except (ProfileNotFound, ModelConfigError):
        return None


def needs_online_fp8(model) -> bool:
    """Whether the plan's FP8 weights come from SGLang's online quantization (``--quantization fp8``):
    the profile plans FP8 (a shipped override) while the checkpoint's own config has no FP8 quantization."""
    if model is None or not str(model.quantization).startswith("fp8"):
        return False
    shipped = Path(__file__).resolve().parents[1] / "profiles" / "models" / f"{model.key}.json"
    if not shipped.is_file() or str(shipped) == str(model.source):
        return False
    try:
        data = json.loads(shipped.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    planned = (data.get("overrides") or {}).get("quantization")
    return bool(planned) and not (data.get("config") or {}).get("quantization_config")


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def _planned_flags(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            val = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
            out[a] = val
            i += 2 if val is not None else 1
        else:
            i += 1
    return out


def _canonical(flag: str, planned: dict[str, str | None]) -> str | None:
    """The planned flag ``flag`` means: exact name, SGLang alias, or a prefix argparse would expand to
    exactly one planned flag (``--tp`` -> ``--tp-size``); None when it touches nothing we planned."""
    flag = ALIASES.get(flag, flag)
    if flag in planned:
        return flag
    hits = [p for p in planned if p.startswith(flag)]
    return hits[0] if len(hits) == 1 else None


def check_extra(planned_argv: list[str], extra: tuple[str, ...], *, force: bool = False) -> list[str]:
    """The extra arguments to append; raises :class:`LaunchError` for ``--use-ray`` (its workers never
    load SGLang plugins) and, unless ``force``, for a flag that sets something the plan sets differently."""
    extra_l = [a for a in extra if a != FORCE_FLAG]
    force = force or len(extra_l) != len(extra)
    if any(_flag_name(a) == "--use-ray" for a in extra_l) and (
        PLUGIN_NAME in planned_argv or any(a == PLUGIN_NAME for a in extra_l)
    ):
        raise LaunchError(
            "--use-ray starts Ray workers that never load SGLang plugins (hpc_advise is unknown there): drop --use-ray"
        )
    planned = _planned_flags(planned_argv)
    if not force:
        given = _planned_flags(extra_l)
        for a in extra_l:
            if "=" in a and a.startswith("--"):
                given[_flag_name(a)] = a.split("=", 1)[1]
        for flag, val in given.items():
            target = _canonical(flag, planned)
            if target is not None and val != planned[target]:
                was = f"{target} {planned[target]}" if planned[target] is not None else target
                raise LaunchError(
                    f"extra argument {flag} {val or ''} contradicts the recommended {was}; "
                    f"pass {FORCE_FLAG} to launch it anyway".replace("  ", " ")
                )
    return extra_l


def build_command(
    c: Candidate,
    model_path: str,
    *,
    python: str | None = None,
    nnodes: int | None = None,
    node_rank: int | None = None,
    dist_init_addr: str | None = None,
    extra: tuple[str, ...] = (),
    model=None,
    force: bool = False,
    environ: dict | None = None,
    node_gpus: int | None = None,
) -> LaunchCommand:
    """The SGLang command for candidate ``c`` serving ``model_path`` (``model``: its profile, when known,
    for the flags the profile implies). ``node_gpus``: GPUs per node, for a candidate larger than one
    node (``node_plan``; ``nnodes`` / ``node_rank`` / ``dist_init_addr`` given explicitly win). Raises
    :class:`LaunchError` when a support rule refuses ``c`` or the extra arguments (see
    :func:`check_extra`)."""
    model = model if model is not None else _profile_for(model_path)
    plan = node_plan(c, node_gpus)
    notes = _node_notes(plan, node_gpus or 0, dist_init_addr) if nnodes is None else []
    if plan.nnodes > 1 and nnodes is None:
        nnodes = plan.nnodes
        node_rank = 0 if node_rank is None else node_rank
        dist_init_addr = dist_init_addr or DIST_INIT_PLACEHOLDER
    argv = [
        python or sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        model_path_arg(model_path, model),
    ]
    argv += ["--tp-size", str(c.tp)]
    if plan.dp > 1:
        argv += ["--dp-size", str(plan.dp)]
    if c.attn_dp > 1:
        argv += ["--attn-dp-size", str(c.attn_dp)]
    if c.ep > 1:
        argv += ["--ep-size", str(c.ep)]
    ours = False
    if c.attention_backend == PLUGIN_NAME:
        argv += ["--attention-backend", PREFILL_BACKEND_FOR_OURS, "--decode-attention-backend", PLUGIN_NAME]
        ours = True
    else:
        argv += ["--attention-backend", c.attention_backend]
    if c.page_size != 1:
        argv += ["--page-size", str(c.page_size)]
    if c.moe_runner and c.moe_runner != "auto":
        argv += ["--moe-runner-backend", c.moe_runner]
        ours = ours or c.moe_runner == PLUGIN_NAME
    if setup_of(c).disable_shared_experts_fusion:
        argv += ["--disable-shared-experts-fusion"]
    if c.kv_dtype != "auto":
        argv += ["--kv-cache-dtype", c.kv_dtype]
    if needs_online_fp8(model):
        argv += ["--quantization", "fp8"]
    if nnodes is not None and nnodes > 1:
        argv += ["--nnodes", str(nnodes)]
    if node_rank is not None and (nnodes or 1) > 1:
        argv += ["--node-rank", str(node_rank)]
    if dist_init_addr:
        argv += ["--dist-init-addr", dist_init_addr]
    planned = list(argv)
    forced = force or FORCE_FLAG in extra
    argv += check_extra(planned[3:], tuple(extra), force=forced)
    env = plugins_env(environ) if ours else {}
    if ours and model is not None and model.is_moe:
        router = router_env(c, model)
        if router is not None:
            env[rules.ROUTER_ENV] = "1"
            notes.append(router)
    return LaunchCommand(argv, env, planned, forced, notes)


def router_env(c: Candidate, model) -> str | None:
    """Why the command turns our router GEMM on (``measured.router_for_launch``), or None. Our backends are
    in the command, so the support rules placed it on SM90."""
    cond = rules.conditions(
        model, None, tp=c.tp, ep=c.ep, attn_dp=c.attn_dp, kv_dtype=c.kv_dtype, page_size=c.page_size,
        router_opt_in=False,
    )  # fmt: skip
    cmp = measured.router_for_launch(replace(cond, sm=rules.SM90))
    if cmp is None:
        return None
    return f"{rules.ROUTER_ENV}=1: our router GEMM for the fp32 gate (SGLang's fp32 product within 1e-5); {cmp.figure()}"


_NOT_IMPORTABLE = 3
_NOT_RESOLVED = 4
# The child: SGLang's plugin loader, its parser, then its server-args resolution (our plugin's
# resolution hooks run inside it). Parsing the planned and the full argv and comparing them catches an
# extra argument that changes a planned value through an alias or an abbreviation.
_VALIDATOR = r"""
import argparse, json, sys
planned_n = int(sys.argv[1]); args = sys.argv[2:]
try:
    from sglang.srt.server_args import ServerArgs, prepare_server_args
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(3)
import logging
class Failures(logging.Handler):  # SGLang logs a plugin's exception (logger.exception) and goes on
    def __init__(self):
        super().__init__(logging.ERROR)
        self.seen = []
    def emit(self, record):
        if record.exc_info and "hpc_advise" in record.getMessage():
            self.seen.append(f"{record.exc_info[0].__name__}: {record.exc_info[1]}")
failures = Failures()
logging.getLogger("sglang.srt.plugins").addHandler(failures)
try:
    from sglang.srt.plugins import load_plugins
    load_plugins()
except Exception as exc:
    print(f"note: loading SGLang plugins failed: {exc}", file=sys.stderr)
try:
    from hpc_advise.runtime.sglang import plugin
    st = plugin.status()
    if not st["registered"] and "hpc_advise" in args:
        if failures.seen:
            print(f"note: the hpc_advise plugin failed to register: {failures.seen[-1]}", file=sys.stderr)
        else:
            print("note: the hpc_advise plugin did not register here (is hpc-advise installed in this Python, "
                  "and SGLANG_PLUGINS unset or listing hpc_advise?)", file=sys.stderr)
    for feature, err in st["errors"].items():
        print(f"note: hpc_advise plugin {feature}: {err}", file=sys.stderr)
except Exception as exc:
    print(f"note: hpc_advise plugin not importable: {exc}", file=sys.stderr)
parser = argparse.ArgumentParser(prog="sglang.launch_server")
ServerArgs.add_cli_args(parser)
full = vars(parser.parse_args(args))
if planned_n < len(args):
    plan = vars(parser.parse_args(args[:planned_n]))
    default = vars(parser.parse_args(["--model-path", "x"]))
    for k, v in plan.items():
        if v != default.get(k) and full.get(k) != v and k != "model_path":
            print(f"an extra argument changes {k} from {v!r} to {full.get(k)!r} (pass --force to keep it)", file=sys.stderr)
            sys.exit(5)
try:
    prepare_server_args(args).resolve_once()
except (OSError, ImportError) as exc:
    print(f"parsed; resolution not run: {type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(4)
except RuntimeError as exc:
    if "No accelerator" in str(exc):
        print(f"parsed; resolution needs the GPU host: {exc}", file=sys.stderr)
        sys.exit(4)
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(1)
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(1)
print("ok")
"""


def validate(cmd: LaunchCommand, timeout: float = 180.0, *, force: bool = False) -> tuple[bool | None, str]:
    """SGLang's parser + server-args resolution + our plugin's checks on the command, in a child process.

    Returns (True, '') when SGLang accepts and resolves it, (False, the real cause) when SGLang or our
    plugin refuses it, and (None, why) when it could not be checked (SGLang not importable with the
    command's Python, or resolution needs what this machine lacks: the model's config, a GPU).
    """
    python = cmd.argv[0]
    args = cmd.argv[3:]  # after "python -m sglang.launch_server"
    planned_n = len(args) if force or cmd.forced or not cmd.planned else len(cmd.planned) - 3
    env = dict(os.environ, **cmd.env)
    try:
        res = subprocess.run(
            [python, "-c", _VALIDATOR, str(planned_n), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"cannot run {python}: {exc}"
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else f"exit code {res.returncode}"
    notes = [ln for ln in lines if ln.startswith("note: ")]
    if res.returncode == 0:
        return True, ""
    if res.returncode == _NOT_IMPORTABLE:
        return None, f"SGLang is not importable with {python}: {last}"
    if res.returncode == _NOT_RESOLVED:
        return None, last
    if notes and last not in notes:
        last = f"{last} ({'; '.join(n[6:] for n in notes)})"
    return False, last


def exec_command(cmd: LaunchCommand) -> None:  # pragma: no cover - replaces the process
    env = dict(os.environ, **cmd.env)
    os.execvpe(cmd.argv[0], cmd.argv, env)
