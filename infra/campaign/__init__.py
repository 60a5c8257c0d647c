"""Campaigns: a config file (or the demo's config in code) → Locust runs → reports.

    from infra.campaign import load_campaign, run_campaign
    campaign = load_campaign("examples/sim-campaign.yaml")
    results = run_campaign(campaign, out_root=Path("llmload-reports"))

config.py reads and validates the file, runner.py runs the processes, procs.py keeps them
from outliving the command, report.py builds and describes the reports.
"""

from infra.campaign.config import (
    Campaign,
    Engine,
    NamedWorkload,
    Target,
    load_campaign,
    parse_campaign,
)
from infra.campaign.runner import CampaignError, RunResult, run_campaign

__all__ = [
    "Campaign",
    "CampaignError",
    "Engine",
    "NamedWorkload",
    "RunResult",
    "Target",
    "load_campaign",
    "parse_campaign",
    "run_campaign",
]
