"""Plot create + remove cost against foreign nat rules, from benches/run's results.csv.

One panel per setup: natledger and the floor (one bare iptables-restore batch, or nft -f on
nftables) as curves over the foreign-rule counts measured, CNI portmap and netavark as points
where measured.
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "natledger": dict(color="tab:green", marker="o", linewidth=2.2),
    "floor": dict(color="black", marker=".", linestyle="--"),
    "portmap": dict(color="tab:red", marker="s", linestyle=":"),
    "netavark": dict(color="tab:purple", marker="^", linestyle=":"),
}

# bench setups that are not an iptables backend (benches/common/setup.rs)
TITLES = {
    "nftables": "nftables (foreign rules in a native table)",
    "nftables-iptnft": "nftables (foreign rules in iptables-nft)",
}


def main(csv_path, png_path):
    # (tool, backend) -> {foreign: total ms}
    series = defaultdict(dict)
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("op") != "total":
                continue
            tool = row["tool"].lower()
            key = tool if tool in STYLE else None
            if key is None:
                continue
            series[(key, row["backend"])][int(row["foreign"])] = float(row["median_ms"])
    backends = sorted({b for (_, b) in series})
    fig, axes = plt.subplots(1, len(backends), figsize=(6 * len(backends), 4.5), squeeze=False)
    for ax, backend in zip(axes[0], backends):
        for tool, style in STYLE.items():
            points = series.get((tool, backend))
            if not points:
                continue
            xs = sorted(points)
            ax.plot(xs, [points[x] for x in xs], label=tool, **style)
        ax.set_xscale("symlog", linthresh=1000)
        ax.set_yscale("log")
        ax.set_title(TITLES.get(backend, f"iptables-{backend}"))
        ax.set_xlabel("foreign nat rules")
        ax.set_ylabel("create + remove, median ms")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("Cost of one port forward (create + remove) as the nat table grows")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    print(f"plot: {png_path}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
