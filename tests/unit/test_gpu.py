"""NVML readings: absent without a GPU, per visible device with one (fake NVML module)."""

from types import SimpleNamespace

import pytest

from llmserve.replica.gpu import GpuSample, read_gpus


class FakeNvml:
    def __init__(self, gpus: list[tuple[float, int, int]], fail: bool = False):
        self.gpus, self.fail = gpus, fail

    def nvmlInit(self):
        if self.fail:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=self.gpus[h][1], total=self.gpus[h][2])

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self.gpus[h][0])


def test_no_gpu_means_no_samples_not_zeros():
    assert read_gpus(FakeNvml([], fail=True)) == []


@pytest.mark.parametrize("visible, expected", [(None, [0, 1]), ("1", [1]), ("0,7", [0])])
def test_samples_follow_cuda_visible_devices(monkeypatch, visible, expected):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    nvml = FakeNvml([(50.0, 10, 100), (75.0, 20, 100)])
    samples = read_gpus(nvml)
    assert [s.index for s in samples] == expected
    assert samples[0] == GpuSample(expected[0], *((50.0, 10, 100), (75.0, 20, 100))[expected[0]])
