"""`python -m sluice --version`: the installed client's version (and which gRPC and protobuf it
runs on, and whether sluice.torch can import)."""
import argparse
import sys

import sluice


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m sluice",
                                description="The sluice Python client. Use the `sluice` CLI "
                                            "(libsluice) for the daemon's commands.")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    args = p.parse_args(argv)
    if not args.version:
        p.print_help()
        return 0
    import grpc
    import google.protobuf
    try:
        import torch
        have = "torch %s" % torch.__version__
    except ImportError:
        have = "no torch (sluice.torch unavailable)"
    print("sluice %s (grpcio %s, protobuf %s, %s)" %
          (sluice.__version__, grpc.__version__, google.protobuf.__version__, have))
    return 0


if __name__ == "__main__":
    sys.exit(main())
