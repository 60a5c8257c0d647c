"""Campaigns: a config file (or the demo's config in code) → Locust runs → reports.

    from infra.campaign import load_campaign, run_campaign
    campaign = load_campaign("examples/sim-campaign.yaml")
    results = run_campaign(campaign, out_root=Path("llmload-reports"))

config.py reads and validates the file, runner.py runs the processes, procs.py keeps them
from outliving the command, stop.py ends the run going as `aborted` on SIGTERM or SIGINT
(CampaignStopped: exit 128 + the signal), report.py builds and describes the reports. An
engine sweep (docs/sweeps.md): engine.py starts and stops one configuration's engine,
sweep.py runs the plan once per configuration and writes the sweep report.
"""

from infra.campaign.config import (
    Campaign,
    Engine,
    EngineConfig,
    NamedWorkload,
    Target,
    load_campaign,
    parse_campaign,
)
from infra.campaign.runner import CampaignError, RunResult, run_campaign
from infra.campaign.stop import CampaignStopped

__all__ = [
    "Campaign",
    "CampaignError",
    "CampaignStopped",
    "Engine",
    "EngineConfig",
    "NamedWorkload",
    "RunResult",
    "Target",
    "load_campaign",
    "parse_campaign",
    "run_campaign",
]
