"""The ``export`` command: its arguments, and what it prints."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from mprl.errors import UsageError
from mprl.host.plugins import PluginManager
from mprl.tools.report import shown

if TYPE_CHECKING:
    from mprl_builtin.export.exporter import Exported

#: the formats (torch is imported only when one is written: ``python -m mprl`` stays quick)
FORMATS = ("onnx", "torchscript")

HELP = "write a trained policy as a TorchScript or ONNX file that needs no mprl"
DESCRIPTION = (
    "Write the policy of a run's last checkpoint (or of a checkpoint file) as a file that plays "
    "it without mprl: TorchScript (torch.jit.load) or ONNX (onnxruntime). Observations in, the "
    "actions of act(obs, deterministic=True) out, for any batch size; a recurrent policy takes "
    "its state after the observations and returns the next state after the actions (zeros at "
    "an episode's start). The file is played back against the model before it is written. "
    "See docs/export.md."
)


def add_arguments(parser: argparse.ArgumentParser, plugins: PluginManager) -> None:
    """``export``'s arguments."""
    parser.description = DESCRIPTION
    parser.add_argument("source", metavar="RUN_DIR|CHECKPOINT", help="run directory or .pt file")
    parser.add_argument(
        "--format", choices=FORMATS, default=None,
        help="torchscript (a .pt file for torch.jit.load) or onnx [default: onnx for an -o "
        "ending in .onnx, else torchscript]",
    )  # fmt: skip
    parser.add_argument(
        "-o", "--out", metavar="FILE", default=None,
        help="the file to write; its directory must exist [default: RUN_DIR/policy.pt or "
        "RUN_DIR/policy.onnx]",
    )  # fmt: skip
    parser.add_argument(
        "--force", action="store_true", help="overwrite the file if it exists (refused otherwise)"
    )
    parser.add_argument(
        "--env", default=None,
        help="the checkpoint's env id; needed, as trust, for an id that imports a module "
        "(module:Env-v0)",
    )  # fmt: skip


def run(args: argparse.Namespace, plugins: PluginManager) -> int:
    """``python -m mprl export ...``: 0 written, 1 the plugin's export is broken (nothing
    written); bad input is a ``UsageError`` (exit 2)."""
    from mprl_builtin.export.exporter import export_run
    from mprl_builtin.export.policy import ExportFailed

    try:
        done = export_run(
            args.source, args.out, fmt=args.format, force=args.force, env=args.env,
            plugins=plugins,
        )  # fmt: skip
    except UsageError as exc:  # it may hold what a file says (an env id): escaped
        raise UsageError(shown(str(exc))) from None
    except ExportFailed as exc:
        print(f"mprl: error: {shown(str(exc))}; nothing was written", file=sys.stderr)
        return 1
    print("\n".join(shown(line) for line in describe(done).splitlines()))
    return 0


def describe(done: Exported) -> str:
    """What was written, for a person: the file, its inputs and outputs, what was checked."""
    size = f"{done.size / 1024:,.1f} KiB" if done.size >= 1024 else f"{done.size} bytes"
    lines = [
        f"mprl: wrote {done.path} ({done.kind}, {size}): {done.algorithm} on {done.env}, "
        f"{done.env_steps:,} env steps",
    ]
    width = max(len(t.name) for t in (*done.inputs, *done.outputs))
    for title, tensors in (("inputs: ", done.inputs), ("outputs:", done.outputs)):
        for i, t in enumerate(tensors):
            shape = f"[{', '.join(str(n) for n in t.shape)}]"
            head = title if i == 0 else " " * len(title)
            lines.append(f"  {head} {t.name:<{width}}  {shape} {t.dtype}")
    if done.state_shapes:
        names = ", ".join(done.state_shapes)
        lines.append(
            f"  state:   {names}: zeros at an episode's start; pass each step's next_* back in"
        )
    lines.append(f"  checked: {done.checked}")
    return "\n".join(lines)
