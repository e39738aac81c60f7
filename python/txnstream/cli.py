"""The ``txnstream`` command line."""

from __future__ import annotations

import click


@click.group()
@click.version_option(package_name="txnstream")
def main() -> None:
    """Txnstream: a durable, embeddable, transactional message log."""


@main.command()
@click.option("--data", default="demo-data", show_default=True, help="Fresh data directory.")
@click.option("--inputs", default=2000, show_default=True, help="Input messages to process.")
@click.option(
    "--kill-at",
    default=0.4,
    show_default=True,
    help="Fraction of inputs committed before the workload is killed with kill -9.",
)
def demo(data: str, inputs: int, kill_at: float) -> None:
    """Run the main job: CTP workload, kill -9, recovery, exactly-once check, audit, report."""
    from txnstream import demo as job

    if inputs < 1 or not 0 < kill_at < 1:
        raise click.BadParameter("need --inputs >= 1 and 0 < --kill-at < 1")
    raise SystemExit(job.main(data, inputs, kill_at))


if __name__ == "__main__":
    main()
