"""Markdown table cells and tables for the report's outputs (numbers as the paper prints them)."""
from __future__ import annotations


def fmt(x, nd=1) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def cost(x) -> str:
    """EFLOPs / V100-days: one decimal at paper scale, significant digits for small (CPU) runs."""
    return "—" if x is None else f"{x:.3g}" if 0 < abs(x) < 0.05 else f"{x:.1f}"


def md(head: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])


def days_cell(days, bounds=None) -> str:
    if days is None:
        return "∞"
    if isinstance(days, str):
        return days
    return cost(days) + (f" ({cost(bounds[0])}-{cost(bounds[1])})" if bounds else "")
