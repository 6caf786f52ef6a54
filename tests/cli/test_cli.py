"""The command line prints the library's numbers: float64 as repr, dps results to all digits."""
import csv
import io
import json
import subprocess
import sys

import mpmath as mp

import symfield as sf


def _run(*args):
    r = subprocess.run([sys.executable, "-m", "symfield", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return dict(line.split(None, 1) for line in r.stdout.strip().splitlines())


def test_qstar_prints_plain_floats():
    out = _run("qstar", "relu", "--sigma-w2", "1.5", "--sigma-b2", "0.1")
    assert out["chi1"] == "0.75" and float(out["q_star"]) == sf.q_star("relu", 1.5, 0.1)


def test_dps_digits_survive_printing():
    out = _run("map", "erf", "--q", "1", "--q12", "0.5", "--sigma-w2", "1.5", "--sigma-b2", "0.1", "--dps", "30")
    ref = sf.qab_map("erf", 1.0, 1.0, 0.5, 1.5, 0.1, dps=30)
    with mp.workdps(30):
        assert abs(mp.mpf(out["qab_map"]) - ref) < mp.mpf(10) ** -28


# ---------------------------------------------------------------- dps = N prints N significant digits
def _cli(capsys, *argv):
    from symfield.cli.main import main
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0 and err == "", err
    return out


def _digits(text):
    """Significant digits written in a decimal number (trailing zeros count: they were computed)."""
    mantissa = text.strip().lstrip("+-").lower().split("e")[0].replace(".", "")
    assert mantissa.isdigit(), text
    return len(mantissa.lstrip("0"))


def _erf_eoc(sb):
    """erf EOC from its closed forms (docs/theory.md section 3): E[erf'^2](q) = (4/pi)/sqrt(1 + 4q), so
    chi1 = 1 gives sigma_w2 = pi/4 sqrt(1 + 4q); then q = sigma_w2 (2/pi) asin(2q/(1 + 2q)) + sigma_b2."""
    with mp.workdps(45):
        sw = lambda q: mp.pi / 4 * mp.sqrt(1 + 4 * q)  # noqa: E731
        q = mp.findroot(lambda q: sw(q) * 2 / mp.pi * mp.asin(2 * q / (1 + 2 * q)) + mp.mpf(sb) - q, mp.mpf("0.7"))
        return sw(q), q


def test_eoc_dps_30_prints_30_digits_that_match_the_closed_form(capsys):
    text = dict(line.split(None, 1) for line in _cli(capsys, "eoc", "erf", "--sigma-b2", "0.1", "--dps", "30")
                .strip().splitlines())
    js = json.loads(_cli(capsys, "eoc", "erf", "--sigma-b2", "0.1", "--dps", "30", "--json"))
    sw, q = _erf_eoc("0.1")
    for name, ref in (("sigma_w2", sw), ("q_star", q)):
        assert _digits(text[name]) >= 30 and js[f"{name}_exact"] == text[name]    # JSON: the same text, all digits,
        assert js[name] == float(mp.mpf(text[name]))                             # beside the number itself
        with mp.workdps(45):
            assert abs(mp.mpf(text[name]) / ref - 1) < mp.mpf(10) ** -28, (name, text[name], ref)
    assert js["sigma_b2_exact"] == "0." + "1" + "0" * 29 and js["sigma_b2"] == 0.1
    assert js["stable"] is True and 0 < js["q_slope"] < 1


def test_eoc_tanh_dps_30_satisfies_both_equations_to_28_digits(capsys):
    """tanh has no closed form: chi1 = 1 and q* = sigma_w2 V(q*) + sigma_b2 by mpmath quadrature at 45 digits."""
    text = dict(line.split(None, 1) for line in _cli(capsys, "eoc", "tanh", "--sigma-b2", "0.1", "--dps", "30")
                .strip().splitlines())
    assert _digits(text["sigma_w2"]) >= 30 and _digits(text["q_star"]) >= 30
    with mp.workdps(45):
        sw, q = mp.mpf(text["sigma_w2"]), mp.mpf(text["q_star"])
        gauss = lambda f: mp.quad(lambda z: f(mp.sqrt(q) * z) * mp.npdf(z), [-mp.inf, -2, 0, 2, mp.inf])  # noqa: E731
        assert abs(sw * gauss(lambda u: mp.sech(u) ** 4) - 1) < mp.mpf(10) ** -28
        assert abs(sw * gauss(lambda u: mp.tanh(u) ** 2) + mp.mpf("0.1") - q) < mp.mpf(10) ** -28


def test_qstar_dps_keeps_trailing_zeros(capsys):
    """relu: q* = sigma_b2/(1 - sigma_w2/2) = 0.4, chi1 = sigma_w2/2 = 0.75, shown to the 30 digits computed."""
    out = dict(line.split(None, 1) for line in _cli(capsys, "qstar", "relu", "--sigma-w2", "1.5", "--sigma-b2", "0.1",
                                                     "--dps", "30").strip().splitlines())
    assert out["q_star"] == "0.4" + "0" * 29 and out["chi1"] == "0.75" + "0" * 28


def test_eoc_curve_csv_and_json_hold_all_digits(capsys):
    sw, q = _erf_eoc("0.1")
    out = _cli(capsys, "eoc-curve", "erf", "--sigma-b2", "0.1", "--dps", "30")
    row = list(csv.DictReader(io.StringIO(out.split("\n", 1)[1])))[0]
    js = json.loads(_cli(capsys, "eoc-curve", "erf", "--sigma-b2", "0.1", "--dps", "30", "--json"))
    for name, ref in (("sigma_w2", sw), ("q_star", q)):
        assert _digits(row[name]) >= 30 and js[f"{name}_exact"] == [row[name]]
        assert js[name] == [float(mp.mpf(row[name]))]
        with mp.workdps(45):
            assert abs(mp.mpf(row[name]) / ref - 1) < mp.mpf(10) ** -28
