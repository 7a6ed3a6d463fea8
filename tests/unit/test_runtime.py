"""runtime.compile_choice: how `compile: auto` decides, the one function plan, bench and train share."""

import pytest

from tunelab.config import load_config
from tunelab.errors import TunelabError
from tunelab.plan import catalog
from tunelab.runtime import compile_choice


def test_forced_settings_ignore_the_prediction():
    assert compile_choice(True, "cpu", 1.0, 40.0, 1.7).chosen is True
    assert compile_choice(False, "cuda", 1e6, 20.0, 1.3).chosen is False
    assert compile_choice(True, "cpu", 1.0, 40.0, 1.7).mode == "true"


@pytest.mark.parametrize(
    ("device_type", "eager_s", "chosen"),
    [
        ("cuda", 3600.0, True),  # an hour on a GPU: 20 s of compiling is paid back many times
        ("cuda", 60.0, False),  # a minute saves ~13 s at 1.28x, under the 20 s compile
        ("cpu", 30 * 60.0, True),  # the quickstart's half hour on 2 cores: compiling pays
        ("cpu", 60.0, False),  # a one-minute CPU run: compiling costs ~40 s and saves ~25
    ],
)
def test_auto_compiles_when_the_run_pays_the_compile_back(device_type, eager_s, chosen):
    got = compile_choice(
        "auto", device_type, eager_s, catalog.compile_seconds(device_type), catalog.compile_speedup(device_type)
    )
    assert got.mode == "auto" and got.chosen is chosen
    assert device_type in got.why and ("compiled blocks" if chosen else "eager blocks") in got.why


def test_break_even_is_where_the_saving_equals_the_compile():
    # saved = eager x (1 - 1/2) = eager / 2: break-even at eager = 2 x compile
    assert not compile_choice("auto", "cuda", 40.0, 20.0, 2.0).chosen
    assert compile_choice("auto", "cuda", 40.1, 20.0, 2.0).chosen
    assert not compile_choice("auto", "cuda", None, 20.0, 2.0).chosen


@pytest.mark.parametrize(("given", "stored"), [("auto", "auto"), ("true", True), ("false", False)])
def test_config_takes_auto_and_booleans(given, stored):
    assert load_config(None, [f"compile={given}"]).compute.compile == stored
    assert load_config(None).compute.compile == "auto"


def test_config_refuses_other_compile_values():
    with pytest.raises(TunelabError, match="compile must be one of auto, true, false"):
        load_config(None, ["compile=sometimes"])
