"""Bad input: a clear error naming the parameter and the value, never a deep traceback or a hang."""
import math
import subprocess
import sys

import pytest

import symfield as sf
from symfield.symbolic.formula import FormulaError


@pytest.mark.parametrize("call,match", [
    (lambda: sf.q_map("relu", -1.0, 1.0, 0.0), r"'q' parameter of q_map must be a finite float > 0\. Got -1\.0"),
    (lambda: sf.q_map("relu", math.nan, 1.0, 0.0), r"'q' parameter of q_map .* Got nan"),
    (lambda: sf.q_map("relu", math.inf, 1.0, 0.0), r"'q' parameter of q_map .* Got inf"),
    (lambda: sf.q_map("relu", 1.0, -1.0, 0.0), r"'sigma_w2' parameter of q_map must be a finite float >= 0\. Got -1\.0"),
    (lambda: sf.q_map("relu", 1.0, 1.0, -0.5), r"'sigma_b2' parameter of q_map .* Got -0\.5"),
    (lambda: sf.qab_map("relu", 1.0, 1.0, 1.5, 1.0, 0.0), r"'q12' parameter of qab_map .*\|q12\| <= sqrt\(q1\*q2\).* Got 1\.5"),
    (lambda: sf.qab_map("tanh", 1.0, 4.0, -2.1, 1.0, 0.0), r"'q12' parameter .* Got -2\.1"),
    (lambda: sf.qab_map("relu", 0.0, 1.0, 0.0, 1.0, 0.0), r"'q1' parameter of qab_map must be a finite float > 0"),
    (lambda: sf.chi1("relu", 1.0, 0.0, q=-2.0), r"'q' parameter of chi1 .* Got -2\.0"),
    (lambda: sf.q_map("relu", 1.0, 1.0, 0.0, dps=2), r"'dps' parameter of q_map must be an integer >= 5"),
    (lambda: sf.activation("relu", pool="min"), r"'pool' parameter of activation must be one of"),
    (lambda: sf.activation("relu", pool="max", k=0), r"'k' parameter of activation must be an integer >= 1"),
    (lambda: sf.activation("leaky_relu", slope=math.nan), r"'slope' parameter"),
    (lambda: sf.activation("leaky_relu", gain=2), r"takes parameters \['slope'\]"),
    (lambda: sf.activation("monomial", n=2.5), r"'n' parameter of activation\('monomial'\)"),
    (lambda: sf.q_growth("tanh", 1.0), r"positively homogeneous"),
])
def test_value_errors(call, match):
    with pytest.raises((ValueError, NotImplementedError), match=match):
        call()


@pytest.mark.parametrize("call,match", [
    (lambda: sf.q_map("relu", "1.0", 1.0, 0.0), r"'q' parameter of q_map must be a finite float > 0\. Got '1\.0'"),
    (lambda: sf.q_map("relu", 1.0, None, 0.0), r"'sigma_w2' parameter"),
    (lambda: sf.activation(3.0), r"'name' parameter of activation must be a str"),
    (lambda: sf.activation("relu", pool="max", k=2.5), r"'k' parameter of activation must be an integer"),
    (lambda: sf.q_map("relu", 1.0, 1.0, 0.0, dps=20.5), r"'dps' parameter"),
])
def test_type_errors(call, match):
    with pytest.raises(TypeError, match=match):
        call()


def test_unknown_activation_did_you_mean():
    with pytest.raises(ValueError, match=r"Got 'tanhh' instead\. Did you mean 'tanh'"):
        sf.activation("tanhh")
    with pytest.raises(ValueError, match=r"Did you mean 'relu'"):
        sf.activation("rleu")


@pytest.mark.parametrize("text,match", [
    ("a*x", r"the name 'a' is not allowed \(the only variable is x\)"),
    ("x + y", r"the name 'y' is not allowed"),
    ("exp(x**2)", r"Gaussian expectations of 'exp\(x\*\*2\)' diverge"),
    ("x*exp(x**2/10)", r"diverge"),
    ("sin(exp(x**2))", r"diverge: log\|phi'\(x\)\|"),
    ("log(x)", r"not real-valued"),
    ("1/x", r"not finite"),
    ("1/(x - 1)", r"pole on the real line"),
    ("sqrt(x)", r"not real-valued"),
    ("x.real", r"not allowed"),
    ("x if x > 0 else 0", r"not allowed"),
    ("'x'", r"not a real number"),
    ("lambda: 0", r"not allowed"),
    ("x**1000", r"exponent larger than 64"),
    ("9**9**9**9", r"exponent larger than 64"),
    ("max(x)", r"'max' takes 2 to 8 argument"),
    ("tanh(x, 2)", r"'tanh' takes 1 argument"),
    ("tanh", None),
    ("import os", r"not a formula"),
    ("x" * 3000, r"longer than 2000"),
])
def test_formulas_refused(text, match):
    if match is None:  # a bare built-in name is the built-in, not an error
        assert sf.activation(text).name == "tanh"
        return
    with pytest.raises(FormulaError, match=match):
        sf.activation(text)


def test_code_injection_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    payloads = [f"__import__('os').system('touch {marker}')",
                f"().__class__.__base__.__subclasses__()",
                f"exec(\"open('{marker}','w')\")",
                f"eval(\"1\")"]
    for p in payloads:
        with pytest.raises(FormulaError):
            sf.activation(p)
    assert not marker.exists()


def test_cli_bad_input_exit_code_2():
    for args in (["kernel", "tanhh"], ["kernel", "import os"], ["map", "relu", "--q", "-1"],
                 ["kernel", "relu", "--pool", "max", "--k", "0"], ["map", "relu"], ["nosuch"],
                 ["eoc", "monomial", "--sigma-b2", "0"], ["eoc", "tanh", "--sigma-b2", "-1"],
                 ["propagate", "relu", "--sigma-w2", "1", "--sigma-b2", "0", "--depth", "0"],
                 ["qstar", "tanh", "--sigma-w2", "nan", "--sigma-b2", "0"]):
        r = subprocess.run([sys.executable, "-m", "symfield", *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("symfield: error:") and "Traceback" not in r.stderr


def test_import_is_light_and_fast():
    # CPU time of the import, not wall time: the suite runs on two processes (-n 2) beside other work
    code = ("import time, sys; t = time.process_time(); import symfield; dt = time.process_time() - t; "
            "print(dt, 'numba' in sys.modules, 'matplotlib' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    dt, numba, mpl = r.stdout.split()
    assert numba == "False" and mpl == "False"
    assert float(dt) < 2.0
