"""``decodesim profiles``: the bundled hardware profiles with their headline figures."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("profiles", help="list hardware profiles with headline figures")
    p.add_argument("--sources", metavar="NAME", default=None, help="print every number of one profile with its source")
    p.set_defaults(handler=handle)


def handle(args) -> int:
    from sim.config.hardware import sources
    from sim.config.setup import load_profile
    from sim.paths import hardware_dir

    if args.sources:
        profile = load_profile(args.sources)
        for path, value, source, estimate in sources(profile):
            print(f"{path:<48} {str(value):<24} {'[estimate] ' if estimate else ''}{source}")
        return 0
    print(f"{'profile':<20}{'chips':>6}{'store':>7}{'GB/chip':>9}{'TB/s/chip':>10}{'bf16 TF':>9}{'SRAM MB':>9}"
          f"{'link GB/s':>10}  description")
    for path in sorted(hardware_dir().glob("*.yaml")):
        p = load_profile(str(path))
        h = p.headline()
        links = p.system.links
        link = f"{links.bandwidth_GBps.value:>10.0f}" if links is not None else f"{'-':>10}"
        print(f"{h['name']:<20}{h['chips']:>6}{h['store']:>7}{h['capacity_GB']:>9.1f}{h['peak_GBps'] / 1e3:>10.2f}"
              f"{h['bf16_TFLOPs']:>9.0f}{h['on_chip_MB']:>9.1f}{link}  {p.description}")
    return 0
