"""SGLang general plugin: ``register()`` is the entry point ``sglang.srt.plugins: hpc_advise``.

SGLang 0.5.23 calls every general plugin from ``sglang.srt.plugins.load_plugins()`` in each process it
starts (launcher, scheduler/TP workers, detokenizer), before parsing server arguments in the launcher,
then applies the hooks registered with its ``HookRegistry``. ``SGLANG_PLUGINS=hpc_advise`` whitelists
us by name; an empty whitelist that omits us turns everything here off.

``register()`` touches no CUDA and is a no-op (one log line) on any other SGLang version. It installs:

- attention backend ``hpc_advise`` (decode only; ``attention.py``): added to
  ``ATTENTION_BACKENDS`` (``register_attention_backend``) and to the argument choices
  (``add_attention_backend_choices``). Use ``--decode-attention-backend hpc_advise --page-size 64``.
- MoE runner ``hpc_advise`` (``moe.py``): ``register_moe_runner_core`` (name + runner core),
  the argument choice (``add_moe_runner_backend_choices``) and AROUND hooks on
  ``Fp8MoEMethod.create_moe_runner`` and ``Fp8MoEMethod.apply``.
- wrappers of two server-args resolution steps (``resolution.py``): a set-up with our backends that
  would fail is refused there, with one line, before any weight loads; our MoE runner where it would
  fall back becomes SGLang's ``auto``.
- with ``HPC_ADVISE_ROUTER_GEMM=1`` only: router GEMM hooks (``router.py``).
- :class:`LogBridge`: our log lines reach SGLang's server log (it configures logging after loading
  plugins, so our INFO lines were dropped).

SGLang only logs hook failures. So ``register()`` applies the hooks itself (``apply_hooks`` is
idempotent; ``load_plugins`` calls it again and skips what is done), checks that each target now runs
our hook, and when a feature's hooks did not take it withdraws that feature's names and raises
:class:`PluginInstallError`: a user who selects a withdrawn backend gets SGLang's own "invalid
choice" error instead of a silently different configuration. ``status()`` reports what is installed.
One consequence of applying early: another plugin loaded after us that hooks the *same* targets
(``Fp8MoEMethod.create_moe_runner``/``apply``, the router targets) would find them already applied and be
skipped by ``HookRegistry``; hooks of other targets are unaffected.
"""

from __future__ import annotations

import importlib.metadata
import logging
import pkgutil
import sys

from hpc_advise import rules

logger = logging.getLogger(__name__)

NAME = "hpc_advise"
SUPPORTED_SGLANG = ("0.5.23",)

FP8_METHOD = "sglang.srt.layers.quantization.fp8.Fp8MoEMethod"
MOE_HOOKS = (
    (f"{FP8_METHOD}.create_moe_runner", "create_moe_runner_hook"),
    (f"{FP8_METHOD}.apply", "apply_hook"),
)
ROUTER_HOOKS = (
    ("sglang.srt.models.hunyuan_v3.HYV3MoEFused.__init__", "block_init_hook", "AFTER"),
    ("sglang.srt.models.qwen3_moe.Qwen3MoeSparseMoeBlock.__init__", "block_init_hook", "AFTER"),
    ("sglang.srt.models.deepseek_v2.MoEGate.forward", "moegate_forward_hook", "AROUND"),
    (
        "sglang.srt.model_loader.loader.DefaultModelLoader.load_weights_and_postprocess",
        "after_load_hook",
        "AFTER",
    ),
)


class PluginInstallError(RuntimeError):
    """A feature of the plugin could not be installed into SGLang (the message says which and why)."""


_STATE: dict = {"sglang": None, "registered": False, "features": {}, "errors": {}}
LOGGER_ROOT = "hpc_advise"


class LogBridge(logging.Handler):
    """Our log lines in SGLang's server log, at its level.

    SGLang loads plugins first in every process and configures logging after
    (``utils.common.configure_logger``: ``basicConfig(force=True)`` on the root logger at
    ``--log-level``). Records logged before that met the root's default WARNING level and no handler:
    INFO lines were dropped, warnings came out bare through Python's last-resort handler. The
    ``hpc_advise`` logger is therefore set to INFO and does not propagate; this handler passes each
    record to the root's handlers once there are any (SGLang's format; records below the root's level
    are dropped, so ``--log-level`` holds), and writes it to stderr in SGLang's format before."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.early = logging.Formatter("[%(asctime)s] %(message)s", "%Y-%m-%d %H:%M:%S")

    def emit(self, record: logging.LogRecord) -> None:
        root = logging.getLogger()
        if root.handlers:
            if record.levelno >= root.getEffectiveLevel():
                ours = logging.getLogger(LOGGER_ROOT).handlers  # a handler on both has had the record
                for handler in root.handlers:
                    if record.levelno >= handler.level and handler not in ours:
                        handler.handle(record)
            return
        try:
            sys.stderr.write(self.early.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging must not raise (logging.Handler.handleError's contract)
            self.handleError(record)


def install_log_bridge() -> LogBridge:
    """Route the ``hpc_advise`` loggers through :class:`LogBridge` (once per process)."""
    pkg = logging.getLogger(LOGGER_ROOT)
    # by name: a re-imported module (tests) brings a new LogBridge class, and one bridge is enough
    bridge = next((h for h in pkg.handlers if type(h).__name__ == LogBridge.__name__), None)
    if bridge is None:
        bridge = LogBridge()
        pkg.addHandler(bridge)
    pkg.setLevel(logging.INFO)
    pkg.propagate = False
    return bridge


def status() -> dict:
    """What ``register()`` did in this process: SGLang version, installed features, errors."""
    return {
        "sglang": _STATE["sglang"],
        "registered": _STATE["registered"],
        "features": dict(_STATE["features"]),
        "errors": dict(_STATE["errors"]),
    }


def sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def create_attention_backend(model_runner):
    """Factory registered under ``hpc_advise`` in SGLang's ``ATTENTION_BACKENDS``."""
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend

    return HpcAdviseAttnBackend(model_runner)


def _register_attention() -> list[str]:
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend

    register_attention_backend(NAME)(create_attention_backend)
    if NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([NAME])
    return [] if ATTENTION_BACKENDS.get(NAME) is create_attention_backend else ["ATTENTION_BACKENDS entry"]


def _withdraw_attention() -> None:
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    ATTENTION_BACKENDS.pop(NAME, None)
    while NAME in ATTENTION_BACKEND_CHOICES:
        ATTENTION_BACKEND_CHOICES.remove(NAME)


def _register_moe() -> list[tuple[str, object, str]]:
    from sglang.srt.arg_groups.choices import MOE_RUNNER_BACKEND_CHOICES, add_moe_runner_backend_choices
    from sglang.srt.layers.moe.moe_runner import runner as runner_mod

    from hpc_advise.runtime.sglang import moe

    if NAME not in runner_mod._CUSTOM_RUNNER_CORE_FACTORIES:
        runner_mod.register_moe_runner_core(NAME, moe.HpcAdviseMoeRunnerCore)
    if NAME not in MOE_RUNNER_BACKEND_CHOICES:
        add_moe_runner_backend_choices([NAME])
    return [(target, getattr(moe, fn), "AROUND") for target, fn in MOE_HOOKS]


def _withdraw_moe() -> None:
    from sglang.srt.arg_groups.choices import MOE_RUNNER_BACKEND_CHOICES
    from sglang.srt.layers.moe import utils as moe_utils
    from sglang.srt.layers.moe.moe_runner import runner as runner_mod

    runner_mod._CUSTOM_RUNNER_CORE_FACTORIES.pop(NAME, None)
    moe_utils._REGISTERED_MOE_RUNNER_BACKEND_NAMES.discard(NAME)
    while NAME in MOE_RUNNER_BACKEND_CHOICES:
        MOE_RUNNER_BACKEND_CHOICES.remove(NAME)


def _router_hooks() -> list[tuple[str, object, str]]:
    from hpc_advise.runtime.sglang import router

    return [(target, getattr(router, fn), kind) for target, fn, kind in ROUTER_HOOKS]


def _runs_hook(target: str, hook) -> bool:
    """Whether the function now at ``target`` is a HookRegistry wrapper chain that calls ``hook``."""
    try:
        fn = pkgutil.resolve_name(target)
    except Exception:
        return False
    fn = getattr(fn, "__func__", fn)
    seen = 0
    while fn is not None and seen < 32:
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                if cell.cell_contents is hook:
                    return True
            except ValueError:  # empty cell
                continue
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    return False


def _install_hooks(feature: str, hooks: list[tuple[str, object, str]]) -> list[str]:
    """Register, apply and verify ``hooks``; returns the targets that do not run our hook."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, hook, kind in hooks:
        if not any(h is hook for _, h, _ in HookRegistry._hooks.get(target, [])):
            HookRegistry.register(target, hook, HookType[kind])
    HookRegistry.apply_hooks()
    missing = [target for target, hook, _ in hooks if not _runs_hook(target, hook)]
    if missing:
        logger.error("hpc_advise: %s hooks did not take on: %s", feature, ", ".join(missing))
    return missing


def register() -> None:
    """Entry point of the ``sglang.srt.plugins`` group (see module docstring)."""
    install_log_bridge()
    version = sglang_version()
    _STATE["sglang"] = version
    if version not in SUPPORTED_SGLANG:
        logger.warning(
            "hpc_advise plugin: SGLang %s is not supported (supported: %s); nothing registered",
            version,
            ", ".join(SUPPORTED_SGLANG),
        )
        return
    errors: dict[str, str] = {}
    features: dict[str, str] = {}

    bad = _register_attention()
    if bad:
        _withdraw_attention()
        errors["attention"] = f"not installed: {', '.join(bad)}"
    else:
        features["attention"] = (
            f"{NAME} (decode; --decode-attention-backend {NAME} --page-size {rules.REQUIRED_PAGE_SIZE})"
        )

    missing = _install_hooks("MoE runner", _register_moe())
    if missing:
        _withdraw_moe()
        errors["moe"] = f"hooks did not take on {', '.join(missing)}"
    else:
        features["moe"] = f"{NAME} (FP8 MoE; --moe-runner-backend {NAME})"

    from hpc_advise.runtime.sglang import resolution

    missing = resolution.install()
    if missing:
        errors["checks"] = f"resolution hooks did not take on {', '.join(missing)}"
    else:
        features["checks"] = "support rules at server-args resolution (hpc_advise.rules)"

    if rules.router_env_enabled():
        missing = _install_hooks("router GEMM", _router_hooks())
        if missing:
            errors["router"] = f"hooks did not take on {', '.join(missing)}"
        else:
            features["router"] = f"router GEMM hooks ({rules.ROUTER_ENV}=1)"

    _STATE["features"] = features
    _STATE["errors"] = errors
    _STATE["registered"] = True
    logger.info("hpc_advise plugin: installed %s", "; ".join(features.values()) or "nothing")
    if errors:
        raise PluginInstallError(
            "hpc_advise plugin could not install: "
            + "; ".join(f"{k}: {v}" for k, v in errors.items())
            + " (those backends are withdrawn; SGLang rejects them if selected)"
        )
