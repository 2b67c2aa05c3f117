"""`workbench classroom serve | export | reset`: the class service and its database.

``serve`` is what the hub runs (``hub_config.service_spec``); ``export`` and ``reset`` are
for the teacher or the hub's admin between two classes, on the machine (or pod) of the hub.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from workbench.errors import ClassroomError

DB_HELP = "the service's SQLite file (the hub config's --db, e.g. /srv/jupyterhub/classroom.sqlite)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    serve = sub.add_parser("serve", help="run the class service (the hub starts it)")
    serve.add_argument("--db", required=True, help=DB_HELP)
    serve.add_argument("--ip", help="listen on this address (default: the host of the service's url)")
    serve.add_argument("--port", type=int, help="listen on this port (default: the port of the service's url)")
    serve.add_argument("--teachers-group", default="teachers",
                       help="the hub group whose members see the class's results (default: teachers)")
    export = sub.add_parser("export", help="write every result as CSV (one line per student and exercise)")
    export.add_argument("--db", required=True, help=DB_HELP)
    export.add_argument("--out", help="the CSV file to write (default: standard output)")
    export.add_argument("--group", help="only the students of this hub group")
    export.add_argument("--teachers-group", default="teachers", help="left out of the table (default: teachers)")
    reset = sub.add_parser("reset", help="forget every result (between two classes); export first")
    reset.add_argument("--db", required=True, help=DB_HELP)
    reset.add_argument("--yes", action="store_true", help="really delete (without it: say what would go)")


def run_cli(args: argparse.Namespace) -> int:
    from workbench.classroom.store import ClassStore, class_table, table_csv

    if args.action == "serve":
        from workbench.classroom.service import Settings, serve

        logging.basicConfig(level=logging.INFO, format="[classroom %(asctime)s] %(message)s")
        asyncio.run(serve(Settings.from_environment(args.db, args.ip, args.port, args.teachers_group)))
        return 0
    if not Path(args.db).is_file():
        raise ClassroomError(f"{args.db} does not exist.",
                             "pass the --db the hub config gives the service (docs/classroom.md).")
    store = ClassStore(args.db)
    try:
        if args.action == "export":
            # Offline: the students who sent results (the hub's class list needs the service's token).
            text = table_csv(class_table(store, None, args.teachers_group), args.group)
            if args.out:
                Path(args.out).write_text(text, encoding="utf-8")
            else:
                sys.stdout.write(text)
            return 0
        rows = len(store.progress())
        if not args.yes:
            print(f"{args.db} holds {rows} student × exercise rows; add --yes to delete them all "
                  "(export them first: workbench classroom export --db ... --out class.csv).")
            return 1
        print(f"deleted {store.reset()} rows from {args.db}")
        return 0
    finally:
        store.close()
