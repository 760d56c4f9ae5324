"""Shared set-up for the advisor model tests: a private HPC_ADVISE_HOME (set per test module and
restored after it, so other parts' tests never see it) and the serving model ``load_or_fit`` gives
there: the shipped fit, as nothing in that home adds serving runs."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def advisor_home(tmp_path_factory):
    """A private HPC_ADVISE_HOME; returns the directory."""
    home = tmp_path_factory.getbasetemp() / "advisor-home"
    mp = pytest.MonkeyPatch()
    mp.setenv("HPC_ADVISE_HOME", str(home))
    yield home
    mp.undo()


@pytest.fixture(scope="module")
def serving_model(advisor_home):
    from hpc_advise.advisor import serving_model as pm

    model, _ = pm.load_or_fit()
    return model
