"""Rules for a model directory's Python code, for trials with slots_per_trial > 1 (warnings).

Text search, not import: the code runs in the task image, not here, and a warning needs only
the line. A match inside a comment is skipped; one inside a string is not (rare, and cheap
to read past).
"""

from __future__ import annotations

import re
from pathlib import Path

# (pattern, what it is, why it hurts a distributed trial, the fix). Sources:
# - torch.compile(model) returns a wrapper whose state_dict keys gain an `_orig_mod.` prefix, so
#   a checkpoint saved from it does not load into the plain module (pytorch/pytorch#149894; the
#   in-place `model.compile()` keeps the keys, the workaround given in #158519); each rank
#   compiles and caches its own graphs (pytorch/pytorch#189330: rank-specific process-group
#   names in the traced graph miss the cache), and under DDP changing input shapes recompile
#   until the cache limit (pytorch/pytorch#140229).
# - persistent_workers=True keeps the DataLoader's worker processes and what they hold for the
#   life of the iterator: memory that grows per epoch (pytorch/pytorch#62066), leaked file
#   handles with pin_memory (pytorch/pytorch#91252); fairseq turned it off by default "to
#   prevent OOMs" (facebookresearch/fairseq#4524). A trial that restarts after an OOM starts
#   with the same setting and meets the same end.
RULES = (
    (
        re.compile(r"\btorch\.compile\s*\("),
        "torch.compile in a distributed trial",
        "torch.compile(model) returns a wrapper whose state_dict keys carry `_orig_mod.`, so a "
        "checkpoint saved from it does not restore into the plain module, and every rank compiles "
        "(and recompiles on new shapes under DDP) on its own: minutes of start-up per rank, and "
        "ranks that wait on each other's compilation until the collective times out",
        "call model.compile() in place (state_dict keys unchanged) after wrapping in "
        "DistributedDataParallel, or save model._orig_mod.state_dict(); prove it on one slot first",
    ),
    (
        re.compile(r"\bpersistent_workers\s*=\s*True\b"),
        "DataLoader(persistent_workers=True) in a distributed trial",
        "the worker processes live as long as the DataLoader with everything they hold (memory "
        "that grows per epoch, pinned buffers, file handles): host memory runs out on a busy "
        "node, and a trial restarted after the OOM starts the same way",
        "use persistent_workers=False (the default), or keep it with fewer num_workers and a "
        "lower prefetch_factor after measuring each rank's memory",
    ),
)


def problems(model_dir: Path) -> list[tuple[str, str, str]]:
    """(file:line, the matched text, the warning with its reason and fix) per hit."""
    found = []
    for path in sorted(model_dir.rglob("*.py")):
        try:
            text = path.read_text(errors="replace")
        except OSError as e:
            found.append((str(path), "", f"cannot be read ({e.strerror})"))
            continue
        for number, line in enumerate(text.splitlines(), 1):
            code = line.split("#", 1)[0]
            for pattern, what, why, fix in RULES:
                m = pattern.search(code)
                if m:
                    found.append((f"{path}:{number}", m.group(0), f"warning: {what}: {why}; fix: {fix}"))
    return found
