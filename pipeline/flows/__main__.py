"""`python -m pipeline.flows ...`: the flows' command line (pipeline/flows/dvc_flows.py)."""

from pipeline.flows.dvc_flows import main

main()
