"""One module per `tunelab` subcommand: argparse and printing; each calls recipes and components, never another command."""
