"""GPU energy over a stretch of back-to-back device work, from NVML's total-energy counter.

``nvmlDeviceGetTotalEnergyConsumption`` counts millijoules since the driver loaded, but it
advances in steps (the firmware's update period, tens of ms). So a window is not read at its
two ends: a host thread polls the counter every ``poll_s`` while the work runs and keeps
(host time, mJ) at every change; the average power of the window is the slope between the
first and last change that fall inside the busy interval, less a ramp at the start. The
window's device time comes from CUDA events around the whole series; energy per repetition
is average power x device time / repetitions. Power samples (``nvmlDeviceGetPowerUsage``)
are kept beside as a cross-check. Where NVML is missing the meter falls back to sampling
``nvidia-smi --query-gpu=power.draw`` (coarser) and says so in every row (``meter``).

Used by calibration/energy/bench.py (microbenchmarks, the fit's input) and by
validation/energy/steps.py (whole steps, never fitted); it fits nothing.
"""
from __future__ import annotations

import subprocess
import threading
import time

try:
    import pynvml
except ImportError:  # nvidia-ml-py missing: nvidia-smi sampling
    pynvml = None


class Meter:
    """Energy and power of GPU 0 while a callable keeps the device busy."""

    def __init__(self, poll_s: float = 0.001, ramp_s: float = 0.12):
        self.poll_s, self.ramp_s = poll_s, ramp_s
        self.kind = "nvml_energy"
        self.handle = None
        if pynvml is not None:
            try:
                pynvml.nvmlInit()
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
                pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            except Exception:  # noqa: BLE001 - any NVML failure: fall back
                self.handle = None
        if self.handle is None:
            self.kind = "nvidia_smi_power"

    # -- raw readings ---------------------------------------------------------------------
    def energy_mJ(self) -> float | None:
        if self.handle is None:
            return None
        return float(pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))

    def power_W(self) -> float:
        if self.handle is not None:
            return pynvml.nvmlDeviceGetPowerUsage(self.handle) / 1e3
        out = subprocess.run(["nvidia-smi", "--query-gpu=power.draw", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        return float(out.strip().splitlines()[0])

    def state(self) -> dict:
        """Clocks, temperature and the power limit now (for the row)."""
        if self.handle is None:
            return {}
        h = pynvml
        out = {}
        for key, fn in (("sm_MHz", lambda: h.nvmlDeviceGetClockInfo(self.handle, h.NVML_CLOCK_SM)),
                        ("mem_MHz", lambda: h.nvmlDeviceGetClockInfo(self.handle, h.NVML_CLOCK_MEM)),
                        ("temp_C", lambda: h.nvmlDeviceGetTemperature(self.handle, h.NVML_TEMPERATURE_GPU)),
                        ("power_limit_W", lambda: h.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1e3)):
            try:
                out[key] = fn()
            except Exception:  # noqa: BLE001
                out[key] = None
        return out

    def tick_period_s(self, seconds: float = 0.6) -> float:
        """The counter's update period: median gap between changes over ``seconds``."""
        if self.handle is None:
            return float("nan")
        last, changes, t_end = self.energy_mJ(), [], time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            e = self.energy_mJ()
            if e != last:
                changes.append(time.perf_counter())
                last = e
            time.sleep(self.poll_s)
        gaps = sorted(b - a for a, b in zip(changes, changes[1:]))
        return gaps[len(gaps) // 2] if gaps else float("nan")

    # -- a window --------------------------------------------------------------------------
    def measure(self, enqueue, sync, seconds: float, depth: int = 3) -> dict:
        """Run ``enqueue()`` (which queues one batch of device work and returns its repetitions)
        until ``seconds`` have passed, then ``sync()``; return average power over the busy
        window and the counter's facts. Device time is the caller's (CUDA events). At most
        ``depth`` batches are in flight (a CUDA event after each; 0: no throttle), so the
        device stops soon after the host does."""
        inflight = []
        ticks: list[tuple[float, float]] = []
        powers: list[float] = []
        stop = threading.Event()

        def poll():
            last = None
            n = 0
            while not stop.is_set():
                now = time.perf_counter()
                e = self.energy_mJ()
                if e is not None and e != last:
                    ticks.append((now, e))
                    last = e
                if n % 20 == 0:
                    try:
                        powers.append(self.power_W())
                    except Exception:  # noqa: BLE001
                        pass
                n += 1
                time.sleep(self.poll_s)

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        t0 = time.perf_counter()
        reps = 0
        while time.perf_counter() - t0 < seconds:
            reps += enqueue()
            if depth:
                import torch

                ev = torch.cuda.Event()
                ev.record()
                inflight.append(ev)
                if len(inflight) > depth:
                    inflight.pop(0).synchronize()
        sync()
        t1 = time.perf_counter()
        time.sleep(0.01)
        stop.set()
        thread.join()
        inside = [(t, e) for t, e in ticks if t0 + self.ramp_s <= t <= t1]
        row = {"meter": self.kind, "window_s": t1 - t0, "reps": reps, "ticks": len(inside)}
        if len(inside) >= 2:
            (ta, ea), (tb, eb) = inside[0], inside[-1]
            row["avg_W"] = (eb - ea) / 1e3 / (tb - ta)
            row["tick_span_s"] = tb - ta
        else:
            row["avg_W"] = sum(powers) / len(powers) if powers else float("nan")
            row["tick_span_s"] = 0.0
        row["power_samples_W"] = sum(powers) / len(powers) if powers else float("nan")
        return row

    def idle(self, seconds: float) -> dict:
        """Average power with nothing queued on the device."""
        return self.measure(lambda: (time.sleep(0.005), 0)[1], lambda: None, seconds, depth=0)
