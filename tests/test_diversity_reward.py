"""The ``diversity`` group reward (DiverseGRPO-style cluster-size bonus) and how the core calls group
rewards: once per prompt group, in training, chunked scoring and evaluation alike."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from vgrpo_rewards.diversity.impl import cluster_bonus, cluster_labels

from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.errors import RewardError
from vgrpo_platform.host.collect import default_registry
from vgrpo_platform.protocols import Samples
from vgrpo_platform.training.iteration.reward_workers import GroupFeeder, InlineScorer
from vgrpo_platform.training.iteration.scoring import WeightedReward, group_bounds, score_all
from vgrpo_platform.training.loop import Trainer
from vgrpo_platform.training.observe.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = default_registry()


def diversity(**options):
    return REGISTRY.build("reward", "diversity", options, None)


def flat(*colours: float, side: int = 16) -> Samples:
    """One flat grey image per value: images of equal value are one layout."""
    data = torch.tensor(colours, dtype=torch.float32).reshape(-1, 1, 1, 1).expand(-1, 3, side, side)
    return Samples("image", data.clone())


def test_known_clusters_give_known_scores():
    # three tight clusters of sizes 3, 2 and 1, far apart
    centres = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    points = centres[[0, 0, 0, 1, 1, 2]] + 0.01 * torch.tensor(
        [[0, 0], [1, 0], [0, 1], [0, 0], [1, 1], [0, 0]]
    )
    labels = cluster_labels(points, threshold=0.1, clusters=None, method="average")
    assert len(labels.unique()) == 3
    assert labels[0] == labels[1] == labels[2] and labels[3] == labels[4] and labels[5] not in labels[:5]
    assert torch.allclose(cluster_bonus(labels, "inverse"), torch.tensor([1 / 3] * 3 + [1 / 2] * 2 + [1.0]))
    assert torch.allclose(cluster_bonus(labels, "share"), torch.tensor([0.5] * 3 + [2 / 3] * 2 + [5 / 6]))
    # at most 2 clusters: the closest two of the three merge (RMS distances: 0.71 vs 1.0 between centres)
    two = cluster_labels(points, threshold=0.1, clusters=2, method="average")
    assert len(two.unique()) == 2


def test_a_collapsed_group_scores_low_and_the_odd_sample_out_high():
    reward = diversity()
    collapsed = reward.score(flat(0.5, 0.5, 0.5, 0.5), ["p"] * 4, [{}] * 4)
    assert torch.allclose(collapsed["score"], torch.full((4,), 0.25))
    assert collapsed["clusters"].tolist() == [1.0] * 4
    varied = reward.score(flat(0.5, 0.5, 0.5, 0.9), ["p"] * 4, [{}] * 4)
    assert varied["score"].tolist() == pytest.approx([1 / 3] * 3 + [1.0])
    # a looser threshold puts the odd one in the same cluster: back to collapsed
    loose = diversity(threshold=0.5).score(flat(0.5, 0.5, 0.5, 0.9), ["p"] * 4, [{}] * 4)
    assert torch.allclose(loose["score"], torch.full((4,), 0.25))


def test_video_is_embedded_frame_by_frame_and_audio_is_refused():
    frames = flat(0.1, 0.1, 0.8).data[:, None].expand(-1, 2, -1, -1, -1)  # [3, F=2, 3, H, W]
    out = diversity().score(Samples("video", frames.clone(), fps=8.0), ["p"] * 3, [{}] * 3)
    assert out["score"].tolist() == pytest.approx([0.5, 0.5, 1.0])
    assert diversity().modalities == frozenset({"image", "video"})


def test_group_bounds():
    assert group_bounds(["a"] * 6, 3) == [slice(0, 3), slice(3, 6)]
    assert group_bounds(["a"] * 5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]  # ragged tail
    assert group_bounds(["a", "a", "b", "a"], None) == [slice(0, 2), slice(2, 3), slice(3, 4)]


def test_score_all_calls_a_group_reward_once_per_group():
    samples = flat(0.5, 0.5, 0.5, 0.1, 0.5, 0.9)  # group 0 collapsed, group 1 all different
    prompts = ["same"] * 6  # one prompt drawn twice: only group_size tells the groups apart
    rewards = [WeightedReward("diversity", diversity(), 0.2)]
    terms, details = score_all(rewards, samples, prompts, group_size=3)
    assert terms["diversity"].tolist() == pytest.approx([1 / 3] * 3 + [1.0] * 3)
    assert details["diversity/clusters"].tolist() == [1.0] * 3 + [3.0] * 3
    # without group_size a run of equal prompts is one group: here all six rows
    terms, _ = score_all(rewards, samples, prompts)
    assert terms["diversity"].tolist() == pytest.approx([0.25, 0.25, 0.25, 1.0, 0.25, 1.0])


def test_a_group_reward_with_the_wrong_number_of_scores_is_named():
    class Short:
        modalities = frozenset({"image"})
        groups = True

        def score(self, samples, prompts, metadata):
            return torch.zeros(len(samples) - 1)

    with pytest.raises(RewardError, match=r"group reward 'short' returned 2 scores for a group of 3"):
        score_all([WeightedReward("short", Short(), 1.0)], flat(0.1, 0.2, 0.3), ["p"] * 3, group_size=3)


def test_chunked_scoring_hands_group_rewards_whole_groups():
    samples = flat(0.5, 0.5, 0.1, 0.9, 0.3, 0.3)
    prompts = ["a", "a", "b", "b", "c", "c"]
    scorer = InlineScorer([WeightedReward("diversity", diversity(), 1.0)], overlap=True)
    try:
        feeder = GroupFeeder(scorer, prompts, 2, step=1)
        for rows in (slice(0, 1), slice(1, 4), slice(4, 6)):  # chunks that split groups
            feeder(Samples("image", samples.data[rows]))
        terms, _ = scorer.collect(feeder.finish())
    finally:
        scorer.close()
    whole, _ = score_all([WeightedReward("diversity", diversity(), 1.0)], samples, prompts, group_size=2)
    assert torch.equal(terms["diversity"], whole["diversity"])
    assert terms["diversity"].tolist() == pytest.approx([0.5, 0.5, 1.0, 1.0, 0.5, 0.5])


def test_a_toy_run_with_diversity_as_a_weighted_term_and_as_a_monitor(tmp_path):
    overrides = [
        f"run.output_dir={tmp_path.as_posix()!r}",
        "run.name='div'",
        "log.progress='none'",
        "train.iterations=2",
        "eval.every=2",
        "log.checkpoint_every=0",
        "log.save_grids=false",
        "log.diagnostics_every=0",
        "rollout.group_size=4",
        "rewards.1.name='diversity'",
        "rewards.1.weight=0.2",
        "eval.rewards.0.name='diversity'",
        'eval.monitor.stop_when_falls=["reward/diversity_eval"]',
    ]
    run_dir = Trainer(resolve_recipe(ROOT / "recipes" / "toy.toml", overrides)).run()
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert len(train) == 2 and evals
    for record in train:
        assert 1 / 4 <= record["reward/diversity"] <= 1.0  # group of 4: 1/4 (collapsed) .. 1 (all apart)
    for record in evals:  # samples_per_prompt = 2: 1/2 .. 1
        assert 1 / 2 <= record["reward/diversity_eval"] <= 1.0
        assert record["reward/diversity"] == record["reward/diversity_eval"]


def test_clip_embeddings_from_a_local_folder(tmp_path):
    from tiny_clip import save_clip

    from vgrpo_platform.protocols import BuildContext
    from vgrpo_platform.testing import check_component

    folder = save_clip(tmp_path / "clip")
    context = BuildContext(device="cpu", seed=0, run_dir=None, recipe_dir=tmp_path)
    # 6 samples cut into 4 clusters: uneven sizes, so the kit sees the scores differ
    check_component("reward", "diversity", {"clip_model": "clip", "clusters": 4}, context, registry=REGISTRY)
    reward = REGISTRY.build("reward", "diversity", {"clip_model": str(folder), "threshold": 1e-3}, context)
    assert reward.modalities == frozenset({"image"})
    out = reward.score(flat(0.5, 0.5, 0.5, 0.9), ["p"] * 4, [{}] * 4)
    assert out["score"].tolist() == pytest.approx([1 / 3] * 3 + [1.0])
    with pytest.raises(RewardError, match="is not a local folder"):
        REGISTRY.build("reward", "diversity", {"clip_model": "openai/clip-vit-base-patch32"}, context)
