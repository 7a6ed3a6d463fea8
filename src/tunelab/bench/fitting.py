"""`tunelab bench fit`: plan's step-time constants fitted to the measured rows of a folder (bench/fit_data.py),
every device once in the fit and once left out, and the tables that show how close plan comes to each row
(printed by the command, and in benchmarks/scripts/plan_accuracy.py's dated report)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import TunelabError
from ..markdown import table
from ..plan import catalog, fit, grpo_fit
from ..plan.fit_rows import Accuracy, CpuBandwidth, Observed, accuracy, catalog_document, observe, stack_ratios
from .fit_data import load, row_lengths

# The folder of row files `bench fit` reads by default, from the repository's root.
ROWS = "benchmarks/plan-accuracy/rows"


@dataclass(frozen=True)
class FitResult:
    observed: list[Observed]
    fits: dict[str, fit.DeviceFit]
    ratios: dict[str, dict]  # plan.fit_rows.stack_ratios
    results: list[Accuracy]
    cpu_bandwidth: CpuBandwidth | None
    left_out: list[str]  # suite records not fitted, and why
    grpo_runs: list[grpo_fit.GrpoRun] = field(default_factory=list)
    grpo: dict[str, catalog.GrpoConstants] = field(default_factory=dict)  # each device's GRPO fit

    def grpo_catalog(self, shipped: dict | None = None) -> dict:
        """The GRPO fit as catalog/grpo.yaml stores it; `shipped`'s devices that no run refits kept as they are."""
        kept = {d: row for d, row in ((shipped or {}).get("devices") or {}).items() if d not in self.grpo}
        return grpo_fit.catalog_document(self.grpo, kept)

    def catalog(self) -> dict:
        """The fit as catalog/fitted.yaml stores it."""
        return catalog_document(self.observed, self.fits, self.ratios, self.cpu_bandwidth)

    def rows(self) -> list[dict]:
        return [a.as_dict() for a in self.results]

    def devices(self) -> dict[str, dict]:
        """Each device's constants in the fit (`in`) and left out (`out`), what its rows determine and where
        the rest comes from."""
        return {
            d: {
                mode: {
                    "constants": asdict(f.constants),
                    "measured": list(f.measured),
                    "carried_from": list(f.carried_from),
                }
                for mode, f in (("in", v.included), ("out", v.left_out))
            }
            for d, v in self.fits.items()
        }


def run(folder: Path) -> FitResult:
    """Read `folder`'s rows, price each with plan's step model and fit every device."""
    from ..sources import resolve_arch

    measured = load(folder)
    if not measured.rows:
        raise TunelabError(f"{folder}: its row files hold no measured row that ran")
    grpo = grpo_fit.fit_devices(measured.grpo)
    archs, lengths, observed = {}, {}, []
    for row in measured.rows:
        if row.model not in archs:
            archs[row.model] = resolve_arch(row.model)
        key = (row.lengths, row.seq_len)
        if key not in lengths:
            lengths[key] = row_lengths(row)
        observed.append(observe(row, archs[row.model], lengths[key]))
    fits = fit.fit_devices([x.observation for x in observed])
    ratios = stack_ratios(observed, fits)
    return FitResult(
        observed,
        fits,
        ratios,
        accuracy(observed, fits, ratios),
        measured.cpu_bandwidth,
        measured.left_out,
        measured.grpo,
        grpo,
    )


def grpo_table(result: FitResult) -> list[str]:
    """Each GRPO run beside plan by part, under its device's fit, and each device's GRPO constants."""
    if not result.grpo_runs:
        return []
    rows = [row for run in result.grpo_runs for row in grpo_fit.table_rows(run, result.grpo[run.device])]
    out = table(["GRPO run", "part", "plan s", "measured s", "plan vs measured"], rows)
    constants = [
        [
            d,
            f"{c.decode_op_s * 1e6:.2f}",
            f"{c.decode_flop_efficiency:.2f}",
            f"{c.update_scale:.3f}",
            f"{c.scoring_scale:.3f}",
        ]
        for d, c in result.grpo.items()
    ]
    return [
        *out,
        "",
        *table(["device", "decode µs per op", "decode FLOP efficiency", "update scale", "scoring scale"], constants),
    ]


def rows_table(rows: list[dict]) -> list[str]:
    """Each row: measured seconds per step, plan's prediction with its device in the fit and left out."""
    header = ["device", "row", "fit", "measured s", "in: predicted (error)", "out: predicted (error)", "source"]
    cells = [
        [
            r["device"],
            r["label"] + (f" ({r['stack']})" if r["stack"] != "tunelab" else ""),
            "yes" if r["fit"] and r["stack"] == "tunelab" else "no",
            f"{r['measured_s']:.3f}",
            f"{r['predicted_s_in']:.3f} ({r['error_in']:+.0%})",
            f"{r['predicted_s_out']:.3f} ({r['error_out']:+.0%})",
            r["source"],
        ]
        for r in rows
    ]
    return table(header, cells)


def constants_table(devices: dict[str, dict]) -> list[str]:
    """Each device's constants (FitResult.devices) in the fit and left out."""
    header = ["device", "mode", "matmul", "attention", "bandwidth", "launch µs", "measured here", "carried from"]
    cells = []
    for d, modes in devices.items():
        for m, f in modes.items():
            c = f["constants"]
            cells.append(
                [
                    d,
                    m,
                    f"{c['matmul']:.3f}",
                    f"{c['attention']:.3f}",
                    f"{c['bandwidth']:.3f}",
                    f"{c['launch_s'] * 1e6:.2f}",
                    ", ".join(f["measured"]) or "-",
                    ", ".join(f["carried_from"]) or "assumed (plan/fit.py ASSUMED)",
                ]
            )
    return table(header, cells)
