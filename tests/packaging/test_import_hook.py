"""``import visionpe`` stays light (no timm) and still puts its models into timm's registry, in either import order;
the post-import hook under it runs once, after the module, and never breaks the import it watches."""
import subprocess
import sys
import textwrap
import warnings

import pytest

from visionpe._import_hook import when_imported


def _python(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_import_visionpe_imports_no_timm_and_timm_gets_the_models_when_imported():
    out = _python("""
        import sys
        import visionpe
        print("timm" in sys.modules, "torchvision" in sys.modules)
        import timm
        print(len(timm.list_models("vpe_*")) > 0, timm.is_model("vpe_vit_small_patch16_224"))
    """)
    assert out.split() == ["False", "False", "True", "True"]


def test_timm_imported_first_gets_the_models_at_import_visionpe():
    out = _python("""
        from timm import create_model, list_models
        print(list_models("vpe_*") == [])
        import visionpe
        print(type(create_model("vpe_deit_tiny_patch16_224", pe="rope_axial", img_size=32, patch_size=8)).__name__)
    """)
    assert out.split() == ["True", "VisionTransformerPE"]


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("vpe_hook_probe")]:
        del sys.modules[name]


def test_callback_runs_once_after_the_module_and_the_module_keeps_its_loader(module_dir):
    (module_dir / "vpe_hook_probe.py").write_text("VALUE = 42\n")
    seen = []
    when_imported("vpe_hook_probe", lambda module: seen.append(module.VALUE))
    assert seen == []
    import vpe_hook_probe
    assert seen == [42]
    assert type(vpe_hook_probe.__loader__).__name__ == "SourceFileLoader"
    assert vpe_hook_probe.__spec__.loader is vpe_hook_probe.__loader__
    import importlib
    importlib.reload(vpe_hook_probe)
    assert seen == [42]  # once
    when_imported("vpe_hook_probe", lambda module: seen.append(-module.VALUE))  # already imported: at once
    assert seen == [42, -42]


def test_an_availability_probe_does_not_use_up_the_hook(module_dir):
    """``importlib.util.find_spec(name)`` (how libraries test whether timm is installed) finds the module without
    importing it: the callback waits for the real import."""
    import importlib.util
    (module_dir / "vpe_hook_probe_spec.py").write_text("VALUE = 7\n")
    seen = []
    when_imported("vpe_hook_probe_spec", lambda module: seen.append(module.VALUE))
    assert importlib.util.find_spec("vpe_hook_probe_spec") is not None and seen == []
    import vpe_hook_probe_spec  # noqa: F401
    assert seen == [7]
    assert not [f for f in sys.meta_path if getattr(f, "name", None) == "vpe_hook_probe_spec"]


def test_a_failing_callback_warns_and_the_import_succeeds(module_dir):
    (module_dir / "vpe_hook_probe_bad.py").write_text("VALUE = 1\n")

    def broken(module):
        raise KeyError("registry changed")

    when_imported("vpe_hook_probe_bad", broken)
    with pytest.warns(RuntimeWarning, match="broken failed after importing vpe_hook_probe_bad: KeyError"):
        import vpe_hook_probe_bad
    assert vpe_hook_probe_bad.VALUE == 1


def test_a_missing_module_fails_as_usual_and_the_hook_waits(module_dir):
    seen = []
    when_imported("vpe_hook_probe_later", seen.append)
    with pytest.raises(ModuleNotFoundError):
        import vpe_hook_probe_later  # noqa: F401
    (module_dir / "vpe_hook_probe_later.py").write_text("VALUE = 3\n")
    import importlib
    importlib.invalidate_caches()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import vpe_hook_probe_later  # noqa: F811
    assert [m.VALUE for m in seen] == [3]
