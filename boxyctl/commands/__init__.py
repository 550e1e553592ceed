"""boxyctl's subcommands: one module each (its main(args) returns the exit status),
listed in one table (table.py) that the parser, cli.parse and main's dispatch read."""
