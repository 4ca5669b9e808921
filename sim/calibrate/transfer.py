"""Kernel costs for chips nobody measured: a rule fitted across the measured GPUs, checked
leave-one-GPU-out (issue 44, item 3).

The rule expresses each kernel class against the chip's own figures, so that what carries from
chip to chip is a quality, not a number of nanoseconds:

* start-up in clock cycles: ``startup_ns x clock_GHz`` (launch-to-first-work and tail are a
  number of SM cycles for the same code);
* the rate as a fraction of the chip's own sustained store stream (``stream_fraction``);
* a row-parallel class's per-CTA rate in bytes per cycle per CTA (``cta_bandwidth_GBps / clock_GHz``).

Fitted across every profile whose ``kernels.provenance`` says ``measured`` (one figure per class:
the geometric mean of the cycles and rates, the mean of the fractions); the leave-one-GPU-out
check fits on all measured GPUs but one and predicts that one's classes, and its median |error|
per GPU is the rule's uncertainty. With fewer than two measured GPUs there is no such check and
``transferred()`` refuses to give costs (a rule with no measured error is no better than the
derived rule the profile already has).

    python -m sim.calibrate.transfer            # the fit and the leave-one-GPU-out error per GPU
"""

from __future__ import annotations

import argparse
import math
import statistics

from sim.config.hardware import HardwareProfile
from sim.paths import hardware_dir
from sim.setup import load_profile


def normalised(hw: HardwareProfile) -> dict[str, dict[str, float]]:
    """A measured profile's classes in the rule's units (cycles, fractions, bytes per cycle per CTA)."""
    clock = hw.compute.clock_GHz.value
    out = {}
    for name, c in hw.kernels.classes.items():
        row = {"startup_cycles": c.startup_ns.value * clock, "stream_fraction": c.stream_fraction.value}
        if c.cta_bandwidth_GBps is not None:
            row["cta_bytes_per_cycle"] = c.cta_bandwidth_GBps.value / clock
        out[name] = row
    return out


def fit(chips: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """One figure per class and quantity over the chips that measured it."""
    classes = sorted({c for table in chips.values() for c in table})
    rule = {}
    for c in classes:
        rows = [table[c] for table in chips.values() if c in table]
        rule[c] = {}
        for key in ("startup_cycles", "cta_bytes_per_cycle"):
            values = [r[key] for r in rows if r.get(key, 0) > 0]
            if values:
                rule[c][key] = math.exp(statistics.fmean(math.log(v) for v in values))
        rule[c]["stream_fraction"] = statistics.fmean(r["stream_fraction"] for r in rows)
    return rule


def predict(rule: dict, hw: HardwareProfile) -> dict[str, dict[str, float]]:
    """The rule's classes on ``hw``: start-up in ns, stream fraction, per-CTA GB/s."""
    clock = hw.compute.clock_GHz.value
    out = {}
    for c, r in rule.items():
        row = {"startup_ns": r.get("startup_cycles", 0.0) / clock, "stream_fraction": r["stream_fraction"]}
        if "cta_bytes_per_cycle" in r:
            row["cta_bandwidth_GBps"] = r["cta_bytes_per_cycle"] * clock
        out[c] = row
    return out


def leave_one_out(measured: dict[str, HardwareProfile]) -> dict[str, dict]:
    """Per measured GPU: the rule fitted without it, its classes predicted, median and worst |error| (%)."""
    tables = {name: normalised(hw) for name, hw in measured.items()}
    out = {}
    for name, hw in measured.items():
        others = {n: t for n, t in tables.items() if n != name}
        if not others:
            continue
        got = predict(fit(others), hw)
        errs = []
        for c, k in hw.kernels.classes.items():
            if c in got:
                errs.append(abs(got[c]["startup_ns"] / k.startup_ns.value - 1))
                errs.append(abs(got[c]["stream_fraction"] / k.stream_fraction.value - 1))
        out[name] = {"median_abs_pct": round(100 * statistics.median(errs), 1),
                     "worst_abs_pct": round(100 * max(errs), 1), "figures": len(errs)}
    return out


def measured_profiles() -> dict[str, HardwareProfile]:
    """The bundled single-chip profiles whose kernel costs were measured on their own chip."""
    out = {}
    for path in sorted(hardware_dir().glob("*.yaml")):
        hw = load_profile(path.stem)
        p = hw.kernels.provenance if hw.kernels is not None else None
        if p is not None and p.kind == "measured" and hw.chips == 1:
            out.setdefault(p.chip_key, hw)  # one profile per measured chip
    return out


def transferred(hw: HardwareProfile, measured: dict[str, HardwareProfile]) -> tuple[dict, float]:
    """(classes, uncertainty %) for an unmeasured chip: the rule over every measured GPU, its
    uncertainty the worst GPU's median leave-one-out error. Refuses with fewer than two GPUs."""
    loo = leave_one_out(measured)
    if len(loo) < 2:
        raise ValueError(f"{len(measured)} measured GPU(s): a transfer rule needs at least two for its "
                         "leave-one-GPU-out error")
    rule = fit({n: normalised(h) for n, h in measured.items()})
    return predict(rule, hw), max(v["median_abs_pct"] for v in loo.values())


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    measured = measured_profiles()
    print(f"measured GPUs: {', '.join(f'{k} ({h.name})' for k, h in measured.items()) or 'none'}")
    loo = leave_one_out(measured)
    if not loo:
        print("leave-one-GPU-out: not possible with one measured GPU; no profile takes transferred costs")
    for name, e in loo.items():
        print(f"leave-one-GPU-out {name}: median |error| {e['median_abs_pct']}%, worst {e['worst_abs_pct']}% "
              f"over {e['figures']} figures")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
