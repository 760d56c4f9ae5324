"""profiles.resolve: names, HF ids of quantized re-uploads and point releases to shipped profiles."""

from __future__ import annotations

import pytest

from hpc_advise.profiles import ProfileNotFound, get_gpu, get_model
from hpc_advise.profiles.resolve import resolve_gpu, resolve_model


@pytest.mark.parametrize(
    "name,key",
    [
        ("Qwen/Qwen3-235B-A22B-FP8", "qwen3-235b-a22b"),
        ("qwen3-235b-a22b", "qwen3-235b-a22b"),
        ("deepseek-ai/DeepSeek-V3.1", "deepseek-v3"),
    ],
)
def test_quantized_uploads_and_point_releases_map_to_the_base_profile(name, key):
    assert resolve_model(name).key == get_model(key).key


def test_unknown_names_say_which_name():
    with pytest.raises(ProfileNotFound, match=r"no model profile for 'no-such-model'"):
        resolve_model("no-such-model")
    with pytest.raises(ProfileNotFound, match=r"no GPU profile for 'z9000'"):
        resolve_gpu("z9000")
    assert resolve_gpu("NVIDIA H200").key == get_gpu("h200").key


def test_fp8_reupload_ids_mean_fp8_weights():
    from hpc_advise.advisor.candidates import planned_quants, rank_weight_bytes
    from hpc_advise.advisor.roofline import Deployment
    from hpc_advise.profiles.resolve import resolve_model

    bf16 = resolve_model("glm-5")
    fp8 = resolve_model("zai-org/GLM-5-FP8")
    assert bf16.quantization == "bf16" and fp8.quantization == "fp8-block128" and fp8.key == bf16.key
    # sized as FP8: about half the weight bytes of the bf16 checkpoint
    assert planned_quants(fp8) == ("fp8_block", "fp8_block") and planned_quants(bf16) == ("bf16", "bf16")
    sizes = [rank_weight_bytes(m, Deployment(8, 1, 8, *planned_quants(m))) for m in (fp8, bf16)]
    assert sizes[0] < 0.55 * sizes[1]
    assert resolve_model("hy3").quantization == "fp8-per-tensor"  # a shipped FP8 profile keeps its scheme


def test_a_reuploads_id_is_the_checkpoint_launched():
    from hpc_advise.profiles.resolve import resolve_model

    assert resolve_model("zai-org/GLM-5-FP8").hf_id == "zai-org/GLM-5-FP8"
    assert resolve_model("GLM-5-FP8").hf_id == ""  # the format, but no repository: launch asks
    assert resolve_model("glm-5").hf_id == "zai-org/GLM-5"
    # an FP8 profile reached through an NVFP4 id plans NVFP4 (what that checkpoint holds)
    nv = resolve_model("nvidia/DeepSeek-R1-NVFP4")
    assert (nv.key, nv.quantization, nv.quant_method, nv.hf_id) == (
        "deepseek-v3", "nvfp4", "modelopt_fp4", "nvidia/DeepSeek-R1-NVFP4"
    )  # fmt: skip
    # another release of the same architecture launches as named, at the profile's own FP8
    r1 = resolve_model("deepseek-ai/DeepSeek-R1")
    assert (r1.quantization, r1.hf_id) == ("fp8-block128", "deepseek-ai/DeepSeek-R1")
