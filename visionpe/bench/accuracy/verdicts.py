"""Plain statements on a benchmark's table, every gap compared with the seed spread (a gap is *beyond* the spread when
|mean_a - mean_b| > std_a + std_b): RoPE-ViT's ordering, the video benchmark's, visionpe against timm's reference
rows, the pairs a rows file names, and LookHere's tuned against untuned. A row that did not learn (its top-1 at the
training size below chance + :data:`LEARNED_MARGIN` points) is left out of every image statement and named as left
out."""
from __future__ import annotations

import math
import statistics

from ...cli.report import ONE_SEED, mean_std, spread_gap, spread_text
from ...data import DATASETS, info
from ...train.metrics import LEARNED_MARGIN, did_not_learn, key_text
from .collect import label, tune_label, tune_of

PLATEAU_MARGIN = 1.0  # points a row's training-size top-1 may rise over its last epoch and count as a plateau


def classes_of(entry: dict, data: str) -> int | None:
    """The class count of a table entry: its runs' (else the named data set's), None when unknown."""
    return entry.get("num_classes") or (info(data)["num_classes"] if data in DATASETS else None)


def chance(entry: dict, data: str) -> float | None:
    """Chance top-1 (%) of a table entry: 100 / its class count, None when unknown."""
    classes = classes_of(entry, data)
    return 100.0 / classes if classes else None


def not_learned(entry: dict, data: str) -> bool:
    """The entry did not learn: its mean top-1 over the seeds at the training size is below chance +
    :data:`~visionpe.train.metrics.LEARNED_MARGIN` points (:func:`~visionpe.train.metrics.did_not_learn`; False
    where the classes or that size are unknown)."""
    classes, (mean, _) = classes_of(entry, data), mean_std(entry["acc"].get(entry["train_res"], []))
    return bool(classes) and not math.isnan(mean) and did_not_learn(mean, classes)


def rising(entry: dict) -> bool:
    """The entry's budget did not reach a plateau: its validation top-1 at the training size rose by more than
    :data:`PLATEAU_MARGIN` points over the last epoch (mean over the seeds; False without two epochs)."""
    pairs = entry.get("last_two") or []
    return bool(pairs) and statistics.fmean(last - before for before, last in pairs) > PLATEAU_MARGIN


def left_out(out: dict, data: str) -> str:
    """The statement naming the rows ``out`` (``{label: entry}`` of one data set) left out as not learned, or
    nothing."""
    if not out:
        return ""
    floor = chance(next(iter(out.values())), data)
    return (f"- Left out as not learned (top-1 at the training size below chance {floor:.1f} % + "
            f"{LEARNED_MARGIN:.0f} points): {', '.join(f'`{n}`' for n in out)}.\n")


def learned_entries(table: dict, data: str) -> tuple[dict, dict]:
    """``({label: entry} of the rows of data set ``data`` that learned, {label: entry} of those that did not})``."""
    entries = {label(k[2], k[3]): v for k, v in table.items() if k[1] == data}
    out = {n: v for n, v in entries.items() if not_learned(v, data)}
    return {n: v for n, v in entries.items() if n not in out}, out

def verdict(table: dict, family: str, data: str, res: list[int]) -> str:
    """Plain statement on RoPE-ViT's ordering (mixed >= axial >= learned APE as the resolution grows), per RoPE
    adaptation, with every gap compared to the seed spread (a gap is "within spread" when
    |mean_a - mean_b| <= std_a + std_b)."""
    out = {label(k[2], k[3]): v for k, v in table.items() if k[:2] == (family, data) and not_learned(v, data)
           and k[2] in ("learned", "rope_axial", "rope_mixed") and not tune_of(k[3])}  # the rows read here
    get = lambda pe, ad: None if label(pe, ad) in out else table.get((family, data, pe, ad))
    learned = get("learned", "default")
    rows = [r for r in res if learned and isinstance(r, int) and r > learned["train_res"]]
    if not learned or not rows:
        return left_out(out, data)

    def gap(a, b, r):
        d, word = spread_gap(a["acc"][r], b["acc"][r])
        return f"{d:+.1f} ({spread_phrase(word, 'spread')})", d >= 0

    lines = []
    for ad in ("none", "pi", "ntk", "yarn"):
        axial, mixed = get("rope_axial", ad), get("rope_mixed", ad)
        if not axial or not mixed:
            continue
        status, parts = 2, []  # 2 holds, 1 holds up to the seed spread, 0 does not hold
        for r in rows:
            for a, b in ((mixed, axial), (axial, learned)):
                text, ahead = gap(a, b, r)
                status = min(status, 2 if ahead else (1 if "within" in text else 0))
            parts.append(f"{r}px: mixed − axial {gap(mixed, axial, r)[0]}, axial − learned {gap(axial, learned, r)[0]}")
        word = ("holds", "holds only up to the seed spread", "does not hold")[2 - status]
        lines.append(f"- RoPE `{ad}`: mixed >= axial >= learned **{word}** at every size above training. "
                     + "; ".join(parts) + ".")
    return ("\n".join(lines) + "\n" if lines else "") + left_out(out, data)


def video_verdict(table: dict, data: str, cols: list, chance: float) -> str:
    """Plain statements on a video benchmark, every gap compared to the seed spread (within when
    |mean_a - mean_b| <= std_a + std_b): learning above chance at the training cell; the best encoding per cell
    and its gap to the runner-up; RoPE pi against none where frames or size change."""
    rows = {label(k[2], k[3]): v for k, v in table.items() if k[1] == data}
    if not rows:
        return ""
    train = next(iter(rows.values()))["train_res"]

    def gap(a, b, c):
        d, word = spread_gap(rows[a]["acc"].get(c, []), rows[b]["acc"].get(c, []))
        return f"{d:+.1f} points ({spread_phrase(word)})"

    lines = []
    m = {n: mean_std(v["acc"].get(train, [])) for n, v in rows.items()}
    above = [n for n, (mu, sd) in m.items() if mu - sd > chance + 5]
    lines.append(f"- Chance is {chance:.1f} %. At the training cell ({train[0]} frames, {train[1]} px) "
                 + (f"{', '.join(f'`{n}`' for n in above)} learned clearly above it (mean − std > chance + 5 points)"
                    if above else "no encoding learned clearly above it (mean − std > chance + 5 points)")
                 + (f"; {', '.join(f'`{n}`' for n in m if n not in above)} did not" if above and len(above) < len(m)
                    else "") + ".")
    for c in cols:
        ranked = sorted(rows, key=lambda n: -mean_std(rows[n]["acc"].get(c, []))[0])
        if len(ranked) < 2:
            break
        where = f"{c[0]} frames, {c[1]} px" + (" (training)" if c == train else "")
        lines.append(f"- {where}: best `{ranked[0]}` {mean_std(rows[ranked[0]]['acc'][c])[0]:.1f} %, "
                     f"ahead of `{ranked[1]}` by {gap(ranked[0], ranked[1], c)}.")
    for pe in ("rope_axial", "rope_mixed"):
        a, b = f"{pe} [pi]", f"{pe} [none]"
        if a in rows and b in rows:
            parts = [f"{c[0]}f {c[1]}px {gap(a, b, c)}" for c in cols if c != train]
            lines.append(f"- `{pe}` pi − none (interpolate vs extrapolate): " + "; ".join(parts) + ".")
    return "\n".join(lines) + "\n"


def compare_text(a: dict, b: dict, r) -> tuple[float, str]:
    """``(mean_a - mean_b, 'within' | 'beyond' | 'one seed')`` at size ``r`` (:func:`~visionpe.cli.report.spread_gap`:
    beyond the seed spread when the gap exceeds std_a + std_b; over one seed, neither)."""
    return spread_gap(a["acc"].get(r, []), b["acc"].get(r, []))


def spread_phrase(word: str, spread: str = "the seed spread") -> str:
    """A :func:`~visionpe.cli.report.spread_gap` word as a phrase: ``"beyond the seed spread"``, or ``"one seed: no
    spread to compare with"``."""
    return "one seed: no spread to compare with" if word == ONE_SEED else f"{word} {spread}"


def rows_verdict(table: dict, data: str, rows: list[dict], res: list) -> str:
    """visionpe against timm's reference rows, every gap compared with the seed spread: the best row of each side
    (highest mean top-1 over the test sizes other than training) compared at every size, then the best of each side
    per size."""
    timm_labels = {r["label"] for r in rows if r["timm"]}
    untuned = {k: v for k, v in table.items() if not tune_of(k[3])}  # the tuned rows have their own verdict
    learned, out = learned_entries(untuned, data)
    entries = {n: (k[2] in timm_labels, v) for k, v in untuned.items() if k[1] == data
               and (n := label(k[2], k[3])) in learned}
    ours = {n: v for n, (is_timm, v) in entries.items() if not is_timm}
    ref = {n: v for n, (is_timm, v) in entries.items() if is_timm}
    if not ours or not ref:
        return left_out(out, data)
    train = next(iter(entries.values()))[1]["train_res"]
    tests = [r for r in res if r != train]
    score = lambda v: statistics.fmean(mean_std(v["acc"].get(r, []))[0] for r in tests)
    best_ours, best_ref = max(ours, key=lambda n: score(ours[n])), max(ref, key=lambda n: score(ref[n]))
    gaps = {r: compare_text(ours[best_ours], ref[best_ref], r) for r in res}
    ahead = [r for r in tests if gaps[r][0] > 0 and gaps[r][1] == "beyond"]
    behind = [r for r in tests if gaps[r][0] < 0 and gaps[r][1] == "beyond"]
    word = ("beats it beyond the seed spread at every test size" if len(ahead) == len(tests) else
            f"is ahead beyond the seed spread at {len(ahead)} of {len(tests)} test sizes"
            + (f", behind beyond it at {len(behind)}" if behind else "") + ", within it elsewhere")
    lines = [f"- Best visionpe row (mean over the test sizes): `{best_ours}` ({score(ours[best_ours]):.1f} %); best "
             f"timm row: `{best_ref}` ({score(ref[best_ref]):.1f} %). visionpe's best **{word}**: "
             + "; ".join(f"{key_text(r)}px {gaps[r][0]:+.1f} ({gaps[r][1]})" for r in res) + "."]
    for r in tests:
        a = max(ours, key=lambda n: mean_std(ours[n]["acc"].get(r, []))[0])
        b = max(ref, key=lambda n: mean_std(ref[n]["acc"].get(r, []))[0])
        gap, spread = compare_text(ours[a], ref[b], r)
        lines.append(f"- {key_text(r)} px: best visionpe `{a}` {mean_std(ours[a]['acc'][r])[0]:.1f} %, best timm "
                     f"`{b}` {mean_std(ref[b]['acc'][r])[0]:.1f} %: {gap:+.1f} points ({spread_phrase(spread)}).")
    return "\n".join(lines) + "\n" + left_out(out, data)


def compare_verdict(table: dict, data: str, pairs: list, res: list) -> str:
    """For each ``[a, b]`` pair of table rows: ``a - b`` at every size, within or beyond the seed spread (a pair with
    a row that did not learn: named, no gap)."""
    entries, out = learned_entries(table, data)
    lines = []
    for a, b in pairs:
        if a in out or b in out:
            lines.append(f"- `{a}` − `{b}`: left out, {' and '.join(f'`{n}`' for n in (a, b) if n in out)} did not "
                         "learn.")
            continue
        if a not in entries or b not in entries:
            lines.append(f"- `{a}` − `{b}`: no finished runs for {' and '.join(f'`{n}`' for n in (a, b) if n not in entries)}.")
            continue
        gaps = [(r, *compare_text(entries[a], entries[b], r)) for r in res]
        beyond = [key_text(r) for r, _, spread in gaps if spread == "beyond"]
        lines.append(f"- `{a}` − `{b}`: " + "; ".join(f"{key_text(r)}px {gap:+.1f} ({spread})" for r, gap, spread in gaps)
                     + f". Beyond the seed spread at {', '.join(beyond) + ' px' if beyond else 'no size'}.")
    return "\n".join(lines) + "\n" if lines else ""


def tune_verdict(table: dict, family: str, data: str, res: list) -> str:
    """LookHere's protocol: per row of one family and data set, tuned − untuned at every test size other than
    training, within or beyond the seed spread; a row that did not learn (tuned or untuned) is left out."""
    lines, out = [], {}
    for (f, d, pe, adaptation), tuned in table.items():
        untuned = table.get((f, d, pe, adaptation.replace("tuned", "untuned", 1)))
        if (f, d) != (family, data) or tune_of(adaptation) != "tuned" or untuned is None:
            continue
        name = tune_label(pe, adaptation)
        if not_learned(untuned, data) or not_learned(tuned, data):
            out[name] = untuned
            continue
        gaps = [(r, *compare_text(tuned, untuned, r)) for r in res if r != tuned["train_res"]]
        ahead = [key_text(r) for r, gap, spread in gaps if spread == "beyond" and gap > 0]
        knob = f"`{tuned['knob']}`" if tuned.get("knob") else "no knob: tuned is untuned"
        lines.append(f"- `{name}` ({knob}) − untuned: "
                     + "; ".join(f"{key_text(r)}px {gap:+.1f} ({spread})" for r, gap, spread in gaps)
                     + f". Ahead beyond the seed spread at {', '.join(ahead) + ' px' if ahead else 'no size'}.")
    return ("\n".join(lines) + "\n" if lines else "") + left_out(out, data)


def pick_verdict(table: dict, family: str, data: str, res: list) -> str:
    """Which row to pick at each test size: the learned row of the best mean top-1 there, among every swept
    adaptation and (with ``--tune``) every tuned row of an encoding with a knob, and the rows within the seed spread
    of it (tied with it); rows that did not learn are left out, and named."""
    entries = {(tune_label if tune_of(k[3]) else label)(k[2], k[3]): v for k, v in table.items()
               if k[:2] == (family, data) and tune_of(k[3]) != "untuned"  # untuned repeats the run's own row
               and (tune_of(k[3]) != "tuned" or v.get("knob"))}  # so does tuned without a knob
    out = {n: v for n, v in entries.items() if not_learned(v, data)}
    learned = {n: v for n, v in entries.items() if n not in out}
    lines = []
    for r in res:
        have = {n: v for n, v in learned.items() if v["acc"].get(r)}
        if not have:
            continue
        best = max(have, key=lambda n: mean_std(have[n]["acc"][r])[0])
        tied = [n for n in have if n != best and compare_text(have[best], have[n], r)[1] == "within"]
        train = have[best]["train_res"]
        scale = f" ({r / train:g}x)" if isinstance(r, int) and isinstance(train, int) else ""
        lines.append(f"- {key_text(r)} px{scale}{' (training size)' if r == train else ''}: `{best}` "
                     f"{spread_text(have[best]['acc'][r])} %; within its seed spread: "
                     + (", ".join(f"`{n}` {mean_std(have[n]['acc'][r])[0]:.1f}" for n in tied) if tied else "none")
                     + ".")
    return ("\n".join(lines) + "\n" if lines else "") + left_out(out, data)
