"""The argv a replica gives vLLM's own parser, the same argv a bare `vllm serve` gets in the
benchmarks and the parity test (pure: no vLLM)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmserve.config.app_config import ModelConfig
from llmserve.replica.vllm_args import engine_kwargs, flags, launch


def model(**kw) -> ModelConfig:
    return ModelConfig(name="m", source="org/m", **kw)


def test_engine_args_and_server_flags_become_vllm_serve_flags():
    m = model(
        engine={
            "dtype": "bfloat16",
            "max_model_len": 2048,
            "enforce_eager": True,
            "enable_prefix_caching": False,
            "cpu_kv_cache_space_gib": 2,
            "extra": {"structured_outputs_config": {"backend": "xgrammar"}},
        },
        server={"enable_auto_tool_choice": True, "tool_call_parser": "hermes"},
        max_tokens_default=64,
    )
    run = launch(m, "/models/m", native_bf16=True)
    argv = run.argv
    assert argv[:4] == ["--model", "/models/m", "--served-model-name", "m"]
    pairs = dict(zip(argv, argv[1:]))
    assert pairs["--dtype"] == "bfloat16" and pairs["--max-model-len"] == "2048"
    assert "--enforce-eager" in argv and "--no-enable-prefix-caching" in argv
    assert pairs["--structured-outputs-config"] == '{"backend": "xgrammar"}'
    assert "--enable-auto-tool-choice" in argv and pairs["--tool-call-parser"] == "hermes"
    # Not vLLM's generation-config override: its max_new_tokens is a cap on every request,
    # where max_tokens_default is the Router's default for requests that give none.
    assert "--override-generation-config" not in argv
    assert "cpu_kv_cache_space_gib" not in " ".join(argv)  # an env var, not a flag
    assert run.env == {"VLLM_CPU_KVCACHE_SPACE": "2"}


@pytest.mark.parametrize(
    "cores, local_rank, expected",
    [
        (None, 0, None),  # vLLM's own choice: the same core in every engine of a host
        (["0", "1"], 0, "0"),
        (["0", "1"], 1, "1"),
        (["0-3", "4-7"], 2, "0-3"),  # more replicas than entries: they share, round robin
        (["2,5"], 1, "2,5"),
    ],
)
def test_each_replica_pins_its_engine_to_its_own_cores(cores, local_rank, expected):
    run = launch(model(engine={"cpu_cores_by_replica": cores}), "/p", True, local_rank)
    assert run.env.get("VLLM_CPU_OMP_THREADS_BIND") == expected
    assert "cpu_cores_by_replica" not in " ".join(run.argv)  # an env var, not a flag


@pytest.mark.parametrize(
    "dtype, num_gpus, native_bf16, expected",
    [
        ("auto", 0, False, "float32"),  # a CPU that emulates bf16: float32 computes ~6x faster
        ("auto", 0, True, "auto"),  # a CPU with AVX-512 BF16 / AMX: the model's own dtype
        ("auto", 1, False, "auto"),  # a GPU replica: the host CPU does not compute
        ("bfloat16", 0, False, "bfloat16"),  # asked for: as asked
    ],
)
def test_auto_dtype_is_float32_on_a_cpu_without_bf16(dtype, num_gpus, native_bf16, expected):
    m = model(engine={"dtype": dtype}, deployment={"num_gpus": num_gpus})
    assert engine_kwargs(m, native_bf16)["dtype"] == expected
    argv = launch(m, "/p", native_bf16).argv
    assert argv[argv.index("--dtype") + 1] == expected


@pytest.mark.parametrize("cores", [[], ["a"], ["0-"], ["0|1"], [""]])
def test_core_lists_are_checked(cores):
    with pytest.raises(ValidationError, match="cpu_cores_by_replica"):
        model(engine={"cpu_cores_by_replica": cores})


def test_auto_tool_choice_needs_a_parser():
    with pytest.raises(ValidationError, match="tool_call_parser"):
        model(server={"enable_auto_tool_choice": True})


def test_server_extra_may_not_repeat_a_typed_flag():
    with pytest.raises(ValueError, match="repeats"):
        launch(model(server={"response_role": "bot", "extra": {"response_role": "x"}}), "/p", True)


def test_flags_table():
    assert flags(
        {
            "dtype": "bfloat16",
            "max_num_seqs": 32,
            "enforce_eager": True,
            "enable_prefix_caching": False,
            "quantization": None,
            "override_generation_config": {"a": 1},
        }
    ) == [
        "--dtype",
        "bfloat16",
        "--max-num-seqs",
        "32",
        "--enforce-eager",
        "--no-enable-prefix-caching",
        "--override-generation-config",
        '{"a": 1}',
    ]
