"""The ``txnstream`` command line."""

from __future__ import annotations

import click


@click.group()
@click.version_option(package_name="txnstream")
def main() -> None:
    """Txnstream: a durable, embeddable, transactional message log."""


@main.command()
@click.option("--data", default="demo-data", show_default=True, help="Fresh data directory.")
@click.option("--txns", default=3000, show_default=True, help="Transactions per mode.")
@click.option("--threads", default=16, show_default=True, help="Concurrent client threads.")
@click.option(
    "--kill-at", default=0.5, show_default=True, help="Fraction of acked ends before kill -9."
)
def demo(data: str, txns: int, threads: int, kill_at: float) -> None:
    """Run the main job: workload, kill -9, recovery, idempotent-end check, report."""
    from txnstream import demo as job

    if txns < 2 or threads < 1 or not 0 < kill_at < 1:
        raise click.BadParameter("need --txns >= 2, --threads >= 1 and 0 < --kill-at < 1")
    raise SystemExit(job.main(data, txns, threads, kill_at))


if __name__ == "__main__":
    main()
