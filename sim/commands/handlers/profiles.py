"""What ``decodesim profiles`` does: list the bundled profiles, or one profile's numbers with their sources."""

from __future__ import annotations

from sim.commands.common import emit_json
from sim.config.hardware import sources
from sim.paths import display_path, hardware_dir
from sim.setup import load_profile
from sim.units import GB_PER_TB


def profile_rows() -> list[dict]:
    """One row per bundled profile: its headline figures, link bandwidth, description, file."""
    rows = []
    for path in sorted(hardware_dir().glob("*.yaml")):
        p = load_profile(str(path))
        links = p.system.links
        rows.append({**p.headline(), "link_GBps": links.bandwidth_GBps.value if links is not None else None,
                     "description": p.description, "file": display_path(path)})
    return rows


def handle(args) -> int:
    if args.sources:
        profile = load_profile(args.sources)
        found = sources(profile)
        if args.json:
            emit_json("profile-sources", {"profile": profile.name, "sources": [
                {"path": path, "value": value, "source": source, "estimate": bool(estimate)}
                for path, value, source, estimate in found]})
            return 0
        for path, value, source, estimate in found:
            print(f"{path:<48} {str(value):<24} {'[estimate] ' if estimate else ''}{source}")
        return 0
    rows = profile_rows()
    if args.json:
        emit_json("profiles", {"profiles": rows})
        return 0
    print(f"{'profile':<20}{'chips':>6}{'store':>7}{'GB/chip':>9}{'TB/s/chip':>10}{'bf16 TF':>9}{'SRAM MB':>9}"
          f"{'link GB/s':>10}  description")
    for h in rows:
        link = f"{h['link_GBps']:>10.0f}" if h["link_GBps"] is not None else f"{'-':>10}"
        print(f"{h['name']:<20}{h['chips']:>6}{h['store']:>7}{h['capacity_GB']:>9.1f}"
              f"{h['peak_GBps'] / GB_PER_TB:>10.2f}"
              f"{h['bf16_TFLOPs']:>9.0f}{h['on_chip_MB']:>9.1f}{link}  {h['description']}")
    return 0
