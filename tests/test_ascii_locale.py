"""Under an ASCII locale (LANG=C with locale coercion off, as on a device machine of stop 49, where the gpu suite
failed in dequant.source; many containers set no LANG): our text files (the CUDA sources, whose comments hold `·`
and `ᵀ`, the golden prompts) are read as the UTF-8 they hold, and the generate CLIs take and print UTF-8 text."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_sources_and_prompts_read_under_an_ascii_locale():
    code = ("import locale; assert locale.getpreferredencoding(False) != 'UTF-8', locale.getpreferredencoding(False)\n"
            "from strata.accel.gpu.dequant import CUDA_DIR, source\n"
            "from strata.reference import golden\n"
            "names = sorted(p.name for p in CUDA_DIR.glob('*.cu'))\n"
            "assert any(not source(n).isascii() for n in names), 'no source holds UTF-8: the test tests nothing'\n"
            "assert any(not p.isascii() for p in golden.load_prompts()[0])\n"
            "print(len(names))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_ascii_env(), capture_output=True, text=True,
                       encoding="utf-8")
    assert r.returncode == 0, r.stderr[-2000:]
    assert int(r.stdout.strip()) > 3


def _ascii_env() -> dict:
    return {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), "LC_ALL": "C", "LANG": "C",
            "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0", "PYTHONPATH": str(ROOT)}


def test_generate_takes_and_prints_utf8_under_an_ascii_locale():
    """A prompt outside ASCII reaches the tokenizer as the shell's UTF-8 bytes (Python decodes argv as ASCII with
    surrogate escapes there, which failed with 'surrogates not allowed'), and the text comes out as UTF-8; bytes
    that are not UTF-8 are a usage error naming the flag."""
    prompt = "Grüße, café — 你好"
    for mod in ("strata.accel", "strata.reference"):
        r = subprocess.run([sys.executable, "-m", mod, "generate", "--prompt", prompt, "-n", "2", "--greedy"] +
                           (["--device", "cpu"] if mod == "strata.accel" else ["--model", _tiny()]),
                           cwd=ROOT, env=_ascii_env(), capture_output=True, timeout=600)
        assert r.returncode == 0, (mod, r.stderr.decode("utf-8", "replace")[-2000:])
        assert r.stdout.startswith(prompt.encode("utf-8")), (mod, r.stdout[:200])
    r = subprocess.run([sys.executable, "-m", "strata.accel", "generate", b"--prompt", b"caf\xe9", "-n", "1"],
                       cwd=ROOT, env=_ascii_env(), capture_output=True, timeout=600)
    assert r.returncode == 2 and b"--prompt is not UTF-8 text" in r.stderr, r.stderr[-500:]


def _tiny() -> str:
    from strata.reference import golden

    return str(golden.model_path("strata-tiny"))           # the bundled model generate runs without --model
