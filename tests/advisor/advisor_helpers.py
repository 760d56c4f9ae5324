"""Shared set-up for the advisor model tests: one fitted serving model per test session, cached on
disk under a private HPC_ADVISE_HOME (the cache is what makes later loads cheap). The variable is set
per test module and restored after it, so other parts' tests never see it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def advisor_home(tmp_path_factory):
    """HPC_ADVISE_HOME with a fitted model in its cache; returns the directory."""
    home = tmp_path_factory.getbasetemp() / "advisor-home"
    mp = pytest.MonkeyPatch()
    mp.setenv("HPC_ADVISE_HOME", str(home))
    from hpc_advise.advisor import serving_model as pm

    pm.load_or_fit()
    yield home
    mp.undo()


@pytest.fixture(scope="module")
def serving_model(advisor_home):
    from hpc_advise.advisor import serving_model as pm

    model, _ = pm.load_or_fit()
    return model
