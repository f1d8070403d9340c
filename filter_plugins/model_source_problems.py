"""Refuse a model source URL that holds a credential, on the controller, before any module on the
node is given it: a module's arguments are logged to the node's journal as it starts, so the
sglang_model module's own refusal would come too late for the journal.

model_source_problems(models) takes the sglang_models role's list of models (each with source,
label and headers_var) and returns one refusal per problem, naming the variable and never quoting
the URL. The rule is url_problems/source_problems of module_utils/model_sources.py, loaded from
there (one rule, two moments, as gpu_expectations does with the server flag check's layout rule).
Unit-tested in tests/unit/test_model_logic.py.
"""

import importlib.util
from pathlib import Path


def _model_sources():
    path = Path(__file__).resolve().parents[1] / "module_utils" / "model_sources.py"
    spec = importlib.util.spec_from_file_location("sglang_canon_model_sources", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_MODEL_SOURCES = _model_sources()


def model_source_problems(models):
    """Every refusal of the models' source URLs, in the order of the models."""
    problems = []
    for model in models:
        problems += _MODEL_SOURCES.source_problems(model.get("source"), model["label"], model["headers_var"],
                                                   "sglang_models_hf_token")
    return problems


class FilterModule:
    """sglang-canon's model source filter."""

    def filters(self):
        return {"model_source_problems": model_source_problems}
