"""The transformers releases the Hugging Face adapters take: from ``MIN_TRANSFORMERS`` on; an older one gets one
line naming the release needed, from ``vpe.apply`` and ``vpe.from_pretrained`` (never a raw AttributeError)."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
from visionpe.backbones.hf import MIN_TRANSFORMERS, check_transformers  # noqa: E402
from trainutil import ROOT  # noqa: E402


def test_the_floor_is_checked_by_release():
    check_transformers(MIN_TRANSFORMERS)
    check_transformers(f"{MIN_TRANSFORMERS}.1")
    check_transformers("5.24.0.dev0")
    for old in ("4.45.2", "4.0.0", "3.5.1"):
        with pytest.raises(ImportError, match=rf"needs transformers >= {MIN_TRANSFORMERS}, found {old}"):
            check_transformers(old)


def test_an_older_transformers_is_refused_in_one_line():
    """A fresh process whose transformers says it is 4.40: importing both warns once, ``apply`` and
    ``from_pretrained`` raise the one line naming the release needed."""
    probe = ("import warnings, transformers\n"
             "transformers.__version__ = '4.40.0'\n"
             "with warnings.catch_warnings(record=True) as caught:\n"
             "    warnings.simplefilter('always')\n"
             "    import visionpe as vpe, visionpe.backbones\n"
             "print([str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)])\n"
             "from transformers import ViTConfig, ViTModel\n"
             "model = ViTModel(ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,\n"
             "                           intermediate_size=16, image_size=16, patch_size=8))\n"
             "for call in (lambda: vpe.apply(model, 'rope_mixed'), lambda: vpe.from_pretrained(ViTModel, '.')):\n"
             "    try:\n"
             "        call()\n"
             "    except (ValueError, ImportError) as err:\n"
             "        print(type(err).__name__, err)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    warned, applied, loaded = done.stdout.strip().splitlines()
    needed = f"visionpe's Hugging Face adapter needs transformers >= {MIN_TRANSFORMERS}, found 4.40.0"
    assert needed in warned and warned.count(needed) == 1
    assert applied.startswith("ValueError model class transformers.models.vit.modeling_vit.ViTModel is not "
                              "supported here: ") and applied.endswith(needed + f": pip install -U "
                                                                                 f"'transformers>={MIN_TRANSFORMERS}'")
    assert loaded == f"ImportError {needed}: pip install -U 'transformers>={MIN_TRANSFORMERS}'"
