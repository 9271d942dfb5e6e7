"""Our text files (the CUDA sources, whose comments hold `·` and `ᵀ`, the golden prompts) hold UTF-8, and a process
under an ASCII locale (LANG=C with locale coercion off, as on the device machine of stop 49, where the gpu suite
failed in dequant.source) reads them as UTF-8, not in the locale's encoding."""
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
    env = {"PATH": os.environ.get("PATH", ""), "LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0",
           "PYTHONUTF8": "0", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                       encoding="utf-8")
    assert r.returncode == 0, r.stderr[-2000:]
    assert int(r.stdout.strip()) > 3
