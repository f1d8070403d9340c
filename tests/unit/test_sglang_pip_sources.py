"""filter_plugins/sglang_pip_sources.py: what pip is given for the package sources, and the line
that says so before the pip run."""

import pytest


@pytest.fixture(scope="module")
def sources_filter(project_module):
    return project_module("filter_plugins/sglang_pip_sources.py")


PYTORCH = {"name": "PyTorch cu130", "index_url": "https://user:secret@torch.example.invalid/whl/cu130",
           "pins": ["torch==2.9.1+cu130", "torchvision==0.24.1+cu130"]}
KERNEL = {"name": "sgl-kernel cu130", "find_links": "/srv/wheels/sgl-kernel-cu130", "pins": ["sgl-kernel==0.3.21+cu130"]}
AUDIO = {"name": "torchaudio cu130", "index_url": PYTORCH["index_url"], "pins": ["torchaudio==2.9.1+cu130"]}


def test_no_sources_leave_pip_as_it_was(sources_filter):
    assert sources_filter.sglang_pip_source_args([]) == []
    assert sources_filter.sglang_pip_source_args(None, "", "/srv/wheelhouse") == ["--no-index", "--find-links",
                                                                                  "/srv/wheelhouse"]
    assert sources_filter.sglang_pip_source_summary([]) == "everything from pip's configured index"


def test_every_source_is_given_to_the_one_pip_run_once(sources_filter):
    args = sources_filter.sglang_pip_source_args([PYTORCH, KERNEL, AUDIO], "https://mirror.example.invalid/simple")
    assert args == ["--index-url", "https://mirror.example.invalid/simple",
                    "--extra-index-url", PYTORCH["index_url"],
                    "--find-links", "/srv/wheels/sgl-kernel-cu130"]


def test_a_wheelhouse_drops_every_index_and_keeps_the_files(sources_filter):
    args = sources_filter.sglang_pip_source_args([PYTORCH, KERNEL], "https://mirror.example.invalid/simple",
                                                 "/srv/wheelhouse")
    assert args == ["--no-index", "--find-links", "/srv/wheelhouse", "--find-links", "/srv/wheels/sgl-kernel-cu130"]
    summary = sources_filter.sglang_pip_source_summary([PYTORCH, KERNEL], "", "/srv/wheelhouse")
    assert summary == ("PyTorch cu130 (torch==2.9.1+cu130, torchvision==0.24.1+cu130) from the wheelhouse; "
                       "sgl-kernel cu130 (sgl-kernel==0.3.21+cu130) from files in /srv/wheels/sgl-kernel-cu130; "
                       "everything else from the wheelhouse /srv/wheelhouse (no index)")


def test_the_summary_names_each_family_and_hides_index_credentials(sources_filter):
    summary = sources_filter.sglang_pip_source_summary([PYTORCH, KERNEL])
    assert summary == ("PyTorch cu130 (torch==2.9.1+cu130, torchvision==0.24.1+cu130) from index "
                       "https://***@torch.example.invalid/whl/cu130; "
                       "sgl-kernel cu130 (sgl-kernel==0.3.21+cu130) from files in /srv/wheels/sgl-kernel-cu130; "
                       "everything else from pip's configured index")
    assert "secret" not in sources_filter.sglang_pip_source_summary([], "https://u:secret@mirror.example.invalid/")


def test_constraints_hold_every_pin_under_its_source(sources_filter):
    assert sources_filter.sglang_pip_source_constraints([PYTORCH, KERNEL]).splitlines()[1:] == [
        "# PyTorch cu130", "torch==2.9.1+cu130", "torchvision==0.24.1+cu130",
        "# sgl-kernel cu130", "sgl-kernel==0.3.21+cu130"]


@pytest.mark.parametrize("bad", [{"pins": ["torch==2.9.1+cu130"]}, "PyTorch", {"name": ""}])
def test_a_source_without_a_name_is_refused(sources_filter, bad):
    with pytest.raises(sources_filter.AnsibleFilterError, match="sglang_install_sources"):
        sources_filter.sglang_pip_source_args([bad])


def test_sources_must_be_a_list(sources_filter):
    with pytest.raises(sources_filter.AnsibleFilterError, match="must be a list"):
        sources_filter.sglang_pip_source_summary({"name": "PyTorch cu130"})
