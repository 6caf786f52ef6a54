"""to_xarray() of every result object (dims, coordinates, units, parameters), the .nc files written by
symfield/io/output.py (the same Dataset), CF phase flags, and the provenance every output file records."""
import datetime
import json
import subprocess
import sys

import numpy as np
import pytest

import symfield as sf
from symfield.core.version import __version__
from symfield.io.output import save, save_result
from symfield.simulate import class_gradients, simulate, simulate_jacobian
from symfield.theory.phases import PHASES
from symfield.theory.gram import gram_fluctuations

xr = pytest.importorskip("xarray")

SW, SB = np.linspace(0.5, 3.0, 4), np.linspace(0.0, 0.2, 3)


def _labelled(ds):
    """Every numeric variable and coordinate has long_name and units; text ones a long_name."""
    for name, v in {**ds.data_vars, **ds.coords}.items():
        assert v.attrs.get("long_name"), name
        if v.dtype.kind in "iuf" and not name.endswith("_mp"):
            assert "units" in v.attrs, name


@pytest.fixture(scope="module")
def prop():
    return sf.propagate("relu", SW[:, None], SB, depth=6, layers=[2, 4, 6])


@pytest.fixture(scope="module")
def gram():
    return gram_fluctuations("relu", 2.0, 0.1, 3)


@pytest.fixture(scope="module")
def pdiag():
    return sf.phase_diagram("erf", SW, SB, depth=4)


def test_import_symfield_does_not_load_xarray():
    code = "import sys, symfield; raise SystemExit(int('xarray' in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_propagation_dims_coords_and_params(prop):
    ds = prop.to_xarray()
    assert ds["q"].dims == ("layer", "sigma_w2", "sigma_b2") and ds["status"].dims == ("sigma_w2", "sigma_b2")
    np.testing.assert_array_equal(ds["layer"], [2, 4, 6])
    np.testing.assert_array_equal(ds["sigma_w2"], SW)
    np.testing.assert_array_equal(ds["sigma_b2"], SB)
    for n in ("q", "qab", "d", "c", "one_minus_c", "gamma"):
        np.testing.assert_array_equal(ds[n].values, getattr(prop, n))
    np.testing.assert_array_equal(ds["last_finite"].values, prop.last_finite)
    assert "qbb" not in ds                      # equal norms: no second variance
    assert ds["status"].attrs["flag_meanings"].split() == ["ok", "overflow", "domain", "underflow"]
    assert list(ds["status"].attrs["flag_values"]) == sorted(prop.STATUS)
    assert json.loads(ds.attrs["params"])["depth"] == 6 and ds.attrs["act"] == "relu"
    assert ds.attrs["method"] == prop.method
    _labelled(ds)
    # selecting by name picks the right point
    assert float(ds["q"].sel(layer=4, sigma_w2=SW[2], sigma_b2=SB[1])) == prop.q[1, 2, 1]


def test_propagation_scalar_and_irregular_grids():
    r = sf.propagate("relu", 2.0, 0.1, depth=3)
    ds = r.to_xarray()
    assert ds["q"].dims == ("layer",) and ds["status"].dims == ()
    assert ds.attrs["sigma_w2"] == 2.0 and ds.attrs["sigma_b2"] == 0.1
    W = np.array([[1.0, 2.0], [3.0, 4.0]])      # both vary along both axes: no axis is named after either
    r = sf.propagate("relu", W, W / 10, depth=2)
    ds = r.to_xarray()
    assert ds["q"].dims == ("layer", "grid_0", "grid_1") and ds["sigma_w2"].dims == ("grid_0", "grid_1")
    np.testing.assert_array_equal(ds["sigma_b2"].values, W / 10)
    r = sf.propagate("relu", SW, 0.1, depth=2)   # one axis: sigma_w2
    assert r.to_xarray()["c"].dims == ("layer", "sigma_w2")


def test_phase_diagram_dims_and_flags(pdiag):
    ds = pdiag.to_xarray()
    assert ds["codes"].dims == ("sigma_w2", "sigma_b2") and ds["eoc"].dims == ("sigma_b2",)
    for n in ("codes", "q_star", "c_star", "gamma_star", "slope", "eoc", "neutrality", "c_depth", "gamma_depth"):
        np.testing.assert_array_equal(ds[n].values, getattr(pdiag, n))
    a = ds["codes"].attrs
    names = dict(zip(a["flag_values"].tolist(), a["flag_meanings"].split()))
    assert names == dict(enumerate(PHASES))
    labels = np.vectorize(names.get)(ds["codes"].values)       # codes -> names, as pd.labels
    assert (labels == pdiag.labels).all()
    assert ds.attrs["act"] == "erf" and ds.attrs["depth"] == 4
    _labelled(ds)


def test_netcdf_file_is_to_xarray(tmp_path, prop, pdiag, gram):
    for i, obj in enumerate((prop, pdiag, gram)):
        path = tmp_path / f"r{i}.nc"
        save_result(path, obj)
        with xr.open_dataset(path) as ds:
            ref = obj.to_xarray()
            xr.testing.assert_equal(ds, ref)
            for name in ref.variables:
                assert set(ref[name].attrs) == set(ds[name].attrs), name
                for k, v in ref[name].attrs.items():
                    np.testing.assert_array_equal(ds[name].attrs[k], v)
            extra = set(ds.attrs) - set(ref.attrs)
            assert extra == {"provenance", "history", "source"}
            assert all(ds.attrs[k] == v for k, v in ref.attrs.items())


def test_cli_phase_netcdf_has_flag_meanings(tmp_path, capsys):
    from symfield.cli.main import main
    path = tmp_path / "p.nc"
    assert main(["phase", "erf", "--sigma-w2", "0.5:3:4", "--sigma-b2", "0:0.2:3", "-o", str(path)]) == 0
    capsys.readouterr()
    with xr.open_dataset(path) as ds:
        assert ds["codes"].attrs["flag_meanings"].split() == list(PHASES)
        assert ds["codes"].attrs["flag_values"].tolist() == list(range(len(PHASES)))
        assert json.loads(ds.attrs["provenance"])["versions"]["symfield"] == __version__


def test_simulation_to_xarray():
    s = simulate("relu", 16, 3, 2.0, 0.1, 3, n_networks=2)
    ds = s.to_xarray()
    assert ds["q"].dims == ("layer",) and ds["c_quantiles"].dims == ("quantile", "layer")
    assert ds["net_q"].dims == ("network", "layer") and ds["gram"].dims == ("network", "layer", "input", "input2")
    np.testing.assert_array_equal(ds["quantile"], [0.05, 0.5, 0.95])
    np.testing.assert_array_equal(ds["network"], [0, 1])
    for n in s.MEANS:
        np.testing.assert_array_equal(ds[n].values, getattr(s, n))
    np.testing.assert_array_equal(ds["net_Vtilde"].values, s.networks.Vtilde)
    np.testing.assert_array_equal(ds["gram"].values, s.gram)
    np.testing.assert_array_equal(ds["inputs"].values, s.inputs)
    assert ds.attrs["width"] == 16 and ds.attrs["n_networks"] == 2 and ds.attrs["method"] == "gram"
    _labelled(ds)


def test_class_gradients_and_jacobian_to_xarray():
    cg = class_gradients("relu", 12, 3, 2.0, 0.0, 4, n_networks=2)
    ds = cg.to_xarray()
    assert ds["grad_favoured"].dims == ("network", "layer") and ds["labels"].dims == ("input",)
    np.testing.assert_array_equal(ds["grad_unfavoured"].values, cg.unfavoured)
    np.testing.assert_array_equal(ds["g0"].values, cg.g0)
    js = simulate_jacobian("tanh", 6, 2, 1.0, 0.0, n_networks=2)
    ds = js.to_xarray()
    assert ds["moments"].dims == ("network", "moment") and ds["moment"].values.tolist() == [1, 2, 3, 4, 5, 6]
    np.testing.assert_array_equal(ds["sv2"].values, js.sv2)
    _labelled(ds)


def test_gram_fluctuations_to_xarray(gram):
    ds = gram.to_xarray()
    assert ds["K"].dims == ("layer", "entry") and ds["gram_cov"].dims == ("layer", "entry", "entry2")
    assert ds["entry"].values.tolist() == ["aa", "bb", "ab"] and ds["c"].dims == ("layer",)
    np.testing.assert_array_equal(ds["K"].values, gram.K)
    np.testing.assert_array_equal(ds["metric_cov"].sel(entry="ab", entry2="aa").values, gram.metric_cov[:, 2, 0])
    assert ds.attrs["sigma_w2"] == 2.0 and json.loads(ds.attrs["params"])["q0"] == [1.0, 1.0, 0.0]
    _labelled(ds)


def test_mpmath_values_keep_their_digits_as_text():
    import mpmath
    from symfield.core.dataset import build
    with mpmath.workdps(30):
        K = np.array([mpmath.mpf(1) / 3, mpmath.mpf("0.1")], dtype=object)
    ds = build({"K": K}, {"layer": [1, 2]}, params={"dps": 30}, dps=30)
    assert ds["K"].dtype == float and ds["K"].values[0] == 1 / 3
    assert ds["K_mp"].values.tolist() == ["0." + "3" * 30, "0.1" + "0" * 29]


def test_sweep_result_to_xarray(pdiag):
    from symfield.sweep import SweepResult
    data = {"sigma_w2": SW, "sigma_b2": SB, "phases": np.asarray(PHASES),
            **{k: getattr(pdiag, k) for k in ("codes", "q_star", "c_star", "gamma_star", "slope", "eoc", "neutrality")}}
    data["codes"] = data["codes"].copy()
    data["codes"][0, 0] = -1                                 # a failed tile
    r = SweepResult("phase", "erf", {"depth": None}, data, None, None, (), (), 0.0,
                    {"kind": "phase", "params": {"depth": None}})
    ds = r.to_xarray()
    assert ds["codes"].dims == ("sigma_w2", "sigma_b2") and ds["eoc"].dims == ("sigma_b2",)
    a = ds["codes"].attrs
    assert a["flag_values"].tolist() == [-1, 0, 1, 2, 3, 4] and a["flag_meanings"].split() == ["failed", *PHASES]
    assert ds.attrs["kind"] == "phase" and json.loads(ds.attrs["params"])["kind"] == "phase"


@pytest.mark.parametrize("suffix", [".csv", ".npz", ".nc"])
def test_every_file_records_provenance(tmp_path, suffix):
    path = tmp_path / f"t{suffix}"
    save(path, {"q": np.arange(3.0)}, {"layer": np.arange(1, 4)}, {"command": "test"})
    if suffix == ".csv":
        prov = json.loads(path.read_text().splitlines()[0][2:])["provenance"]
    elif suffix == ".npz":
        with np.load(path) as z:
            prov = json.loads(str(z["provenance"]))
    else:
        with xr.open_dataset(path) as ds:
            prov = json.loads(ds.attrs["provenance"])
            assert ds.attrs["source"] == f"symfield {__version__}" and ds.attrs["history"].startswith(prov["time"])
    assert prov["argv"] == sys.argv
    when = datetime.datetime.fromisoformat(prov["time"])
    assert when.utcoffset() == datetime.timedelta(0)
    assert abs((datetime.datetime.now(datetime.timezone.utc) - when).total_seconds()) < 600
    assert set(prov["versions"]) == {"symfield", "python", "numpy", "sympy", "mpmath", "numba", "xarray"}
    assert prov["versions"]["symfield"] == __version__ and prov["versions"]["numpy"] == np.__version__


# ---------------------------------------------------------------- issue 28: Jacobian and diagnose results
def test_jacobian_spectrum_to_xarray():
    r = sf.jacobian_spectrum("relu", 2.0, 0.0, 2, weights="orthogonal")     # atoms {0: 1/2, 4: 1/2}
    ds = r.to_xarray()
    assert ds["atom_x"].dims == ("atom",) and ds["atom_x"].values.tolist() == [0.0, 4.0]
    assert ds["atom_mass"].values.tolist() == [0.5, 0.5] and ds["moments"].dims == ("moment",)
    np.testing.assert_array_equal(ds["moments"].values, [4.0 ** k / 2 for k in range(1, 7)])
    assert ds["status"].dims == () and int(ds["status"]) == 3 and ds["q"].dims == ("layer",)
    a = ds["status"].attrs
    assert dict(zip(a["flag_values"].tolist(), a["flag_meanings"].split()))[3] == "atom_at_0_condition_infinite"
    assert ds.attrs["weights"] == "orthogonal" and ds.attrs["depth"] == 2
    _labelled(ds)
    t = sf.jacobian_spectrum("tanh", 1.2, 0.05, 3, dps=20)
    ds = t.to_xarray()
    assert ds["pdf"].dims == ("x",) and ds["x"].size == len(t.x) and ds["moments_mp"].values[0].startswith("0.41696")
    np.testing.assert_array_equal(ds["pdf"].values, t.pdf)
    _labelled(ds)


def test_isometry_diagram_and_diagnosis_to_xarray(tmp_path):
    d = sf.isometry_diagram("tanh", [0.01, 1.0], [0.0, 0.1], 200)
    ds = d.to_xarray()
    assert ds["rel_var"].dims == ("sigma_w2", "sigma_b2") and ds["status"].dims == ("sigma_w2", "sigma_b2")
    np.testing.assert_array_equal(ds["status"].values, d.status)
    assert ds["status"].attrs["flag_meanings"].split()[4] == "moment_out_of_float64_range"
    _labelled(ds)
    rng = np.random.default_rng(0)
    g = sf.init.diagnose([rng.standard_normal((3, 64)), rng.standard_normal((3, 64))], "relu", 2.0, 0.0, bands=False,
                         z=2.0)
    dg = g.to_xarray()
    assert dg["q"].dims == ("layer",) and dg["status"].values.tolist() == [3, 3]
    assert dg["status"].attrs["flag_meanings"].split()[3] == "not_compared" and dg.attrs["z"] == 2.0
    _labelled(dg)
    for i, obj in enumerate((d, g, sf.jacobian_spectrum("relu", 2.0, 0.0, 2, weights="orthogonal"))):
        path = tmp_path / f"j{i}.nc"
        save_result(path, obj)
        with xr.open_dataset(path) as f:
            xr.testing.assert_equal(f, obj.to_xarray())
