"""A rows file (``visionpe benchmark --rows``): a marked part of the report whose rows are labelled, each with its
own ``visionpe train`` arguments, RoPE adaptations, evaluation protocols and data sets; timm's own models (``--pe
timm``) as reference rows; a recipe per data set (``recipes``: each task its own budget)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from ...cli import UserError
from ...cli.recipes import recipe_path
from ...cli.report import markers
from ...data import DATASETS, PROTOCOLS
from ...rotary.scaling import SCALINGS
from ...train import models, settings

ROW_KEYS = {"label": "the row's name in the table", "args": "visionpe train arguments of the row (--pe ...)",
            "scaling": "RoPE adaptations to sweep (default: none)",
            "protocol": "evaluation protocols to sweep (default: the run's own)",
            "data": "data sets the row is trained on (default: every --data)"}
SPEC_KEYS = ("part", "title", "note", "rows", "compare", "recipes")
OLD_KEYS = {"section": "part"}  # the name a key had before (rows files written then still read)


OWN_KEYS = ("config", "data", "seed", "output", "resume", "overwrite")  # set by the benchmark for every run


def read_rows(path: Path) -> dict:
    """A rows file (``--rows``: a path or the name of a shipped one, e.g. ``bench_rows_resolution``): ``{part,
    title, note?, recipes?: {data set: recipe}, rows: [{label, args, scaling?, protocol?, data?}]}``, checked; each
    row gets ``train`` (its arguments as a list), ``parsed`` (those arguments parsed as ``visionpe train`` parses
    them), ``timm`` (True for a ``--pe timm_unpatched`` reference row), ``slug`` (its
    folder) and ``data`` (its data sets, empty for every one); ``recipes`` becomes ``{data set: recipe path}`` (the
    data sets it does not name take ``--config``); ``section``, the old name of ``part``, is read as ``part``."""
    path = recipe_path(path, "rows file")
    spec = settings.read_yaml(path, "rows file")
    where = f"rows file {str(path)!r}"
    for old, new in OLD_KEYS.items():
        if old in spec and new in spec:
            raise UserError(f"{where}: {old!r} is the old name of {new!r}; give one of them")
        if old in spec:
            spec[new] = spec.pop(old)
    for key in ("part", "title", "rows"):
        if key not in spec:
            raise UserError(f"{where}: missing {key!r} (keys: part, title, note, rows)")
    try:
        markers(spec["part"])  # the rule of a marked part's name, the doc's and the records folder's
    except ValueError:
        raise UserError(f"{where}: part must be letters, digits, '_', '.', '-', got {spec['part']!r}") from None
    if not isinstance(spec["rows"], list) or not spec["rows"]:
        raise UserError(f"{where}: rows must be a non-empty list of mappings with keys {', '.join(ROW_KEYS)}")
    rows, slugs = [], set()
    for i, row in enumerate(spec["rows"]):
        if not isinstance(row, dict) or not {"label", "args"} <= set(row) or set(row) - set(ROW_KEYS):
            raise UserError(f"{where}: row {i} must be a mapping with keys label, args and optionally "
                            f"{', '.join(k for k in ROW_KEYS if k not in ('label', 'args'))}, got {row!r}")
        train = shlex.split(str(row["args"]))
        parsed = settings.parse_args(train, prog=f"benchmark (row {row['label']!r} of {path.name})")
        own = [k for k in OWN_KEYS if parsed.get(k) not in (None, False)]
        if own:
            raise UserError(f"{where}: row {row['label']!r} sets {', '.join(own)}; the benchmark sets those for "
                            "every run")
        scaling = row.get("scaling", ["none"])
        if not isinstance(scaling, list) or not scaling or any(v not in SCALINGS for v in scaling):
            raise UserError(f"{where}: row {row['label']!r}: scaling must be a list of {', '.join(SCALINGS)}, "
                            f"got {scaling!r}")
        protocols = row.get("protocol", [])
        if not isinstance(protocols, list) or any(v not in PROTOCOLS for v in protocols):
            raise UserError(f"{where}: row {row['label']!r}: protocol must be a list of {', '.join(PROTOCOLS)}, "
                            f"got {protocols!r}")
        data = data_sets(row.get("data", []), f"{where}: row {row['label']!r}: data")
        slug = re.sub(r"^[.-]+|-+$", "", re.sub(r"[^\w.+-]+", "-", str(row["label"])).replace("+", "-"))
        if not slug:
            raise UserError(f"{where}: row label {row['label']!r} has no letters or digits for its folder name")
        if slug in slugs:
            raise UserError(f"{where}: two rows share the label {row['label']!r} (or its folder name {slug!r})")
        slugs.add(slug)
        rows.append({"label": str(row["label"]), "train": train, "parsed": parsed, "scaling": scaling,
                     "protocol": protocols, "slug": slug, "data": data, "timm": parsed.get("pe") == models.TIMM_UNPATCHED})
    compare = spec.get("compare", [])
    if not isinstance(compare, list) or not all(isinstance(pair, list) and len(pair) == 2
                                                and all(isinstance(v, str) for v in pair) for pair in compare):
        raise UserError(f"{where}: compare must be a list of [label, label] pairs of table rows (e.g. "
                        f"['learned [crop]', 'learned']), got {compare!r}")
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)} (keys: {', '.join(SPEC_KEYS)})")
    recipes = spec.get("recipes", {})
    if not isinstance(recipes, dict):
        raise UserError(f"{where}: recipes must map data sets to recipes (e.g. {{fashion-mnist: "
                        f"bench_fashion_mnist}}), got {recipes!r}")
    data_sets(list(recipes), f"{where}: recipes")
    recipes = {data: recipe_path(str(recipe), f"{where}: recipe of {data}").resolve() for data, recipe in recipes.items()}
    missing = [f"{data}: {path}" for data, path in recipes.items() if not path.is_file()]
    if missing:
        raise UserError(f"{where}: recipes that do not exist: {'; '.join(missing)}")
    return {**spec, "rows": rows, "compare": compare, "recipes": recipes}


def data_sets(names, where: str) -> list[str]:
    """``names`` checked as a list of registered data sets (``where``: what they are, for the error)."""
    if not isinstance(names, list) or any(n not in DATASETS for n in names):
        raise UserError(f"{where} must be a list of data sets, each one of {', '.join(DATASETS)}, got {names!r}")
    return [str(n) for n in names]


def recipe_of(spec: dict, data: str, default: Path) -> Path:
    """The recipe that trains ``data``: the rows file's own for it (``recipes``), else ``default`` (``--config``)."""
    return spec["recipes"].get(data, default)


def runs_on(row: dict, data: str) -> bool:
    """The row is trained on ``data`` (a row without ``data`` on every data set)."""
    return not row["data"] or data in row["data"]


def trained_pairs(spec: dict, data_sets: list[str]) -> list[tuple[str, dict]]:
    """The ``(data set, row)`` pairs the benchmark trains: each of ``data_sets`` with every row that runs on it."""
    return [(data, row) for data in data_sets for row in spec["rows"] if runs_on(row, data)]
