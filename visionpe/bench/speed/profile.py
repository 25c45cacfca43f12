"""Part ``profile`` (opt-in): the training step under ``torch.profiler``: where each encoding's time over
``none`` goes."""
from __future__ import annotations

from collections import Counter

from torch.profiler import ProfilerActivity, profile

from .plan import Setup
from .tables import Table
from .timing import Run


PROFILE_OPS = 5  # operators listed per encoding


def profile_cost(run: Run) -> list[Table]:
    """The training step of each encoding under ``torch.profiler``, at ViT-S/16 and the small config: which operators
    its extra time over ``none`` is spent in."""
    return [profile_table(run, setup) for setup in (run.plan.vit, run.plan.tiny)]


def operator_times(run: Run, step) -> tuple[Counter, Counter]:
    """``(ms, calls)`` per operator of one ``step()``: self time (the device's on CUDA)."""
    cuda = run.device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        step()
        run.sync()
    times, counts = Counter(), Counter()
    for event in prof.key_averages():
        times[event.key] += (event.self_device_time_total if cuda else event.self_cpu_time_total) / 1e3
        counts[event.key] += event.count
    return times, counts


def profile_table(run: Run, setup: Setup) -> Table:
    """Profiles of the setup's training steps, one step each in turn for a few rounds (as the timed tables
    interleave), averaged per step; each encoding's operators compared with ``none``'s."""
    steps = run.train_steps(setup)
    for step in steps.values():
        step(), run.sync()  # warm-up outside the profile
    rounds = max(3, round(4 * run.min_run_time / run.time_per_call(steps["none"])))  # 3 at ViT-S/16, about 14 small
    totals = {name: (Counter(), Counter()) for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            for total, part in zip(totals[name], operator_times(run, step)):
                total.update(part)
    base_times, base_counts = totals.pop("none")
    rows = []
    for name, (times, counts) in totals.items():
        ops = times.keys() | base_times.keys()
        extra = {op: (times[op] - base_times[op]) / rounds for op in ops}
        changed = sorted((op for op in ops if counts[op] != base_counts[op]), key=lambda op: -abs(extra[op]))
        cells = [f"`{op}` {extra[op]:+.1f} ms ({(counts[op] - base_counts[op]) / rounds:+.3g} calls)"
                 for op in changed[:PROFILE_OPS]]
        same = sum(extra[op] for op in ops if counts[op] == base_counts[op])
        rows.append((name, f"{sum(times.values()) / rounds:.1f}", f"{sum(extra.values()):+.1f}",
                     "; ".join(cells) or "-", f"{same:+.1f}"))
    return Table(f"Where the training step's time goes: {setup.label}, batch {setup.batch}, {rounds} profiled steps "
                 f"per encoding", ["pe", "profiled ms / step", "vs none ms",
                                   f"operators it adds or removes, {PROFILE_OPS} largest (ms, calls per step)",
                                   "operators with none's calls, net ms"], rows,
                 f"`torch.profiler`, self time per operator ({'CUDA' if run.device.type == 'cuda' else 'CPU'}), "
                 f"per step, minus `none`'s ({sum(base_times.values()) / rounds:.1f} ms); one step of each model "
                 f"in turn per round. Operators called as often as in `none` (matmuls, GELU, SDPA's forward with a "
                 f"mask) differ by noise, or by the work an encoding adds to them (a mask in the attention kernel); "
                 f"the control row shows the noise. The profiler adds a fixed cost to every operator, so many small "
                 f"operators weigh more here than in the timed tables; Python autograd functions "
                 f"(`_FusedBiasAttentionBackward`, `_RotateBackward`) appear with their interpreter time.")


