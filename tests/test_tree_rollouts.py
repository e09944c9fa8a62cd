"""Tree rollouts (TreeGRPO / BranchGRPO): the tree's layout and node advantages against hand-computed numbers
and a brute force over the leaves, a tiny-model rollout whose shared prefixes are computed once, the loss
against a hand-written per-edge objective, and two iterations of the toy recipe through the real loop."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest
import torch
from tiny_models import DT
from tiny_models import LinearVelocityAdapter as TinyAdapter
from toy_runs import TOY, surrogate_toy_run

from vgrpo_platform.algo import sde, tree
from vgrpo_platform.algo.grpo import group_normalize
from vgrpo_platform.algo.surrogates.configs import BranchGRPOConfig, FlowGRPOConfig, TreeGRPOConfig
from vgrpo_platform.algo.surrogates.flow_grpo import FlowGRPOSurrogate
from vgrpo_platform.config.recipe import resolve_recipe
from vgrpo_platform.errors import RecipeError
from vgrpo_platform.finetune import enable_full_finetune
from vgrpo_platform.protocols import RolloutBatch, SamplerSpec


def digits(leaf: int, k: int, m: int) -> tuple[int, ...]:
    """Leaf ``leaf``'s branch choices, the first branching first."""
    return tuple((leaf // k ** (m - 1 - d)) % k for d in range(m))


def test_node_ids_follow_the_branch_digits():
    ids = tree.node_ids(5, [1, 3], 2)
    assert ids.tolist() == [
        [0, 0, 0, 0, 0],
        [0, 0, 0, 1, 1],
        [0, 1, 1, 2, 2],
        [0, 1, 1, 3, 3],
    ]
    assert tree.leaf_count(3, [0, 2]) == 9


def test_node_advantages_on_a_hand_computed_tree():
    # one tree, k = 2, branching at steps 0 and 1: leaves {0, 1} share the first edge, {2, 3} the other
    rewards = torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=DT)
    groups = torch.zeros(4, dtype=torch.long)
    adv = group_normalize(rewards, groups)  # (r - 3) / (sqrt(3.5) + 1e-4)
    s = math.sqrt(3.5) + 1e-4
    nodes = tree.node_ids(2, [0, 1], 2)
    leaf_mean = tree.node_advantages(adv, groups, nodes, "leaf_mean")
    assert torch.allclose(leaf_mean[:, 0], torch.tensor([-1.5, -1.5, 1.5, 1.5], dtype=DT) / s)
    assert torch.allclose(leaf_mean[:, 1], torch.tensor([-2.0, -1.0, 0.0, 3.0], dtype=DT) / s)
    depth = tree.node_advantages(adv, groups, nodes, "depth_norm")
    # step 0: two nodes +-a, sample std a sqrt(2): +-1/sqrt(2); step 1: the leaves, sample std sqrt(14/3)
    assert torch.allclose(depth[:, 0], torch.tensor([-1, -1, 1, 1], dtype=DT) / math.sqrt(2))
    want = torch.tensor([-2.0, -1.0, 0.0, 3.0], dtype=DT) / math.sqrt(14 / 3)
    assert torch.allclose(depth[:, 1], want, atol=1e-7)


@pytest.mark.parametrize("k, branches, steps", [(3, [0, 2], 4), (2, [1, 2, 4], 6)])
def test_node_advantages_equal_a_brute_force_over_the_leaves(k, branches, steps):
    m, g = len(branches), k ** len(branches)
    gen = torch.Generator().manual_seed(3)
    rewards = torch.randn(2 * g, generator=gen, dtype=DT)  # two trees
    groups = torch.arange(2).repeat_interleave(g)
    adv = group_normalize(rewards, groups)
    nodes = tree.node_ids(steps, branches, k).repeat(2, 1)
    got = {mode: tree.node_advantages(adv, groups, nodes, mode) for mode in ("leaf_mean", "depth_norm")}
    for t in range(2):
        a = adv[t * g : (t + 1) * g].tolist()
        r = rewards[t * g : (t + 1) * g].tolist()
        for j in range(steps):
            c = sum(1 for b in branches if b <= j)  # branchings made by the end of step j
            prefixes = list(itertools.product(range(k), repeat=c))
            below = {p: [i for i in range(g) if digits(i, k, m)[:c] == p] for p in prefixes}
            # BranchGRPO's own formula on the raw rewards: node reward = mean of its leaves' rewards, z-scored
            # (sample std + 1e-8) among the nodes of the depth; a lone node gets 0
            node_r = {p: statistics.fmean(r[i] for i in below[p]) for p in prefixes}
            for i in range(g):
                p = digits(i, k, m)[:c]
                want_mean = statistics.fmean(a[x] for x in below[p])
                assert got["leaf_mean"][t * g + i, j].item() == pytest.approx(want_mean, abs=1e-9)
                if len(prefixes) < 2:
                    want_z = 0.0
                else:
                    values = list(node_r.values())
                    want_z = (node_r[p] - statistics.fmean(values)) / (statistics.stdev(values) + 1e-8)
                # z-scores do not see the group's affine normalisation: advantages give BranchGRPO's numbers
                assert got["depth_norm"][t * g + i, j].item() == pytest.approx(want_z, abs=1e-6)


# ------------------------------------------------------------------------------ the rollout and loss
class CountingAdapter(TinyAdapter):
    """Counts the rows each ``predict`` call sees."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[int] = []

    def predict(self, z_t: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        self.rows.append(z_t.shape[0])
        return super().predict(z_t, t, cond)


def tree_rollout(cfg: FlowGRPOConfig, steps: int = 5, trees: int = 2, seed: int = 0):
    adapter = CountingAdapter()
    surrogate = FlowGRPOSurrogate(cfg)
    g = surrogate.rollout_block
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(trees, 2, 3, generator=gen, dtype=DT).repeat_interleave(g, 0)  # group noise
    cond = {"emb": torch.randn(trees, 2, generator=gen, dtype=DT).repeat_interleave(g, 0)}
    latents, state = surrogate.rollout(adapter, noise, cond, SamplerSpec("euler", steps), gen)
    return adapter, surrogate, cond, latents, state


def test_a_tree_rollout_computes_each_shared_prefix_once():
    cfg = FlowGRPOConfig(tree_branch_steps=[1, 3], tree_sde="all", kl_beta=0.0)
    adapter, _, _, latents, state = tree_rollout(cfg)
    # one forward per node, 2 trees: 1 node each at steps 0 and 1 (which branches), 2 at steps 2 and 3
    # (which branches), 4 at step 4: 20 rows where 8 independent samples would take 40
    assert adapter.rows == [2, 2, 4, 4, 8]
    traj = state.trajectory  # [8, 6, 2, 3]
    # leaves 0 and 1 part at step 3: the same latents up to z after step 2, then different ones
    assert torch.equal(traj[0, :4], traj[1, :4]) and not torch.equal(traj[0, 4], traj[1, 4])
    # leaves 0 and 2 part at step 1
    assert torch.equal(traj[0, :2], traj[2, :2]) and not torch.equal(traj[0, 2], traj[2, 2])
    assert torch.equal(state.old_log_prob[0, :3], state.old_log_prob[1, :3])
    assert not torch.equal(state.old_log_prob[0, 3], state.old_log_prob[1, 3])
    assert not torch.equal(traj[0, 1], traj[4, 1])  # another tree, another prompt
    assert torch.equal(latents, traj[:, -1])
    assert torch.equal(state.sde_mask, torch.ones(8, 5))


def test_branch_only_trees_are_ode_between_branchings_and_siblings_share_their_step_mean():
    cfg = FlowGRPOConfig(tree_branch_steps=[1, 3], kl_beta=0.0)  # tree_sde = "branch"
    adapter, surrogate, cond, _, state = tree_rollout(cfg)
    assert state.sde_mask[0].tolist() == [0, 1, 0, 1, 0]
    traj, grid = state.trajectory, state.timesteps[0]
    # step 0 is an ODE step: z_1 = z_0 + v dt, exactly
    v = TinyAdapter().predict(traj[:1, 0], grid[:1], {"emb": cond["emb"][:1]})
    assert torch.allclose(traj[0, 1], sde.ode_step(traj[:1, 0], v, grid[:1], grid[1:2])[0])
    # the two children of a branching are draws around one mean: each stored log-prob is its own Gaussian's
    t, tn = grid[3:4], grid[4:5]
    v = TinyAdapter().predict(traj[:1, 3], t, {"emb": cond["emb"][:1]})
    s = sde.sde_diffusion(t, 0.7, t_cap=grid[1])
    mean = sde.sde_step_mean(traj[:1, 3], v, t, tn, s)
    std = sde.step_std(s, t, tn)
    for leaf in (0, 1):
        want = torch.distributions.Normal(mean, std[:, None, None]).log_prob(traj[leaf : leaf + 1, 4]).mean()
        assert state.old_log_prob[leaf, 3].item() == pytest.approx(want.item(), abs=1e-10)


def edge_objective(adapter, state, cond, adv_nodes, weights) -> torch.Tensor:
    """The per-edge objective written out: for each distinct trained edge, -A_node exp(lp - lp_old),
    averaged over the edges (on-policy, so no clip binds)."""
    terms = []
    for (row, j), a in adv_nodes.items():
        z, t, tn = (
            state.trajectory[row : row + 1, j],
            state.timesteps[row, j : j + 1],
            state.timesteps[row, j + 1 :],
        )
        v = adapter.predict(z, t, {"emb": cond["emb"][row : row + 1]})
        s = sde.sde_diffusion(t, 0.7, t_cap=state.timesteps[row, 1])
        mean = sde.sde_step_mean(z, v, t, tn[:1], s)
        lp = sde.gaussian_log_prob(
            state.trajectory[row : row + 1, j + 1], mean, sde.step_std(s, t, tn[:1]), 2
        )
        terms.append(-a * torch.exp(lp - state.old_log_prob[row, j]) * weights)
    return torch.stack(terms).sum()


@pytest.mark.parametrize("mode", ["leaf_mean", "depth_norm"])
def test_the_loss_trains_each_edge_once_with_its_node_advantage(mode):
    cfg = FlowGRPOConfig(tree_branch_steps=[1, 3], tree_sde="all", tree_advantage=mode, kl_beta=0.0)
    adapter, surrogate, cond, latents, state = tree_rollout(cfg)
    enable_full_finetune(adapter.denoiser)
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.5, 0.0, 1.0, 0.5, 2.0], dtype=DT)
    groups = torch.arange(2).repeat_interleave(4)
    adv = group_normalize(rewards, groups)
    batch = RolloutBatch(["a"] * 8, groups, cond, latents, rewards, {}, advantages=adv, state=state)
    surrogate.prepare(batch, adapter, torch.Generator().manual_seed(1))
    # the distinct edges: step j of node n in tree t, taken at the first leaf below it
    ids = tree.node_ids(5, [1, 3], 2)
    want_adv = tree.node_advantages(adv, groups, ids.repeat(2, 1), mode)
    edges = {}
    for t, j in itertools.product(range(2), range(5)):
        for n in sorted(set(ids[:, j].tolist())):
            row = t * 4 + int((ids[:, j] == n).nonzero()[0])
            edges[(row, j)] = float(want_adv[row, j])
    assert {(int(r), int(j)) for r, j in state.train_mask.nonzero().tolist()} == set(edges)
    n_edges = (
        len(edges) // 2
    )  # per tree, steps 0..4: 1 + 2 + 2 + 4 + 4 (a branching step's edges are its children's)
    assert n_edges == 13 and torch.allclose(state.edge_weight, torch.full((8,), 4 / 13))
    loss, metrics = surrogate.loss(batch, adapter)
    assert metrics["ratio_mean"] == pytest.approx(1.0)
    params = list(adapter.denoiser.parameters())
    grad = torch.autograd.grad(loss, params)
    want = edge_objective(adapter, state, cond, edges, 1.0 / (2 * n_edges))
    # (the surrogate takes advantages in float32, as flow_grpo always has)
    assert loss.item() == pytest.approx(want.item(), abs=1e-7)
    want_grad = torch.autograd.grad(want, params)
    assert any(float(g.abs().max()) > 1e-3 for g in want_grad)
    for a, b in zip(grad, want_grad, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-8)


def test_depth_pruning_leaves_those_steps_untrained():
    cfg = FlowGRPOConfig(tree_branch_steps=[1, 3], tree_sde="all", tree_prune_steps=[0, 4], kl_beta=0.0)
    adapter, surrogate, cond, latents, state = tree_rollout(cfg)
    groups = torch.arange(2).repeat_interleave(4)
    adv = torch.randn(8, dtype=DT, generator=torch.Generator().manual_seed(2))
    batch = RolloutBatch(["a"] * 8, groups, cond, latents, adv, {}, advantages=adv, state=state)
    surrogate.prepare(batch, adapter, torch.Generator())
    assert state.train_mask[:, [0, 4]].sum() == 0
    assert state.train_mask[:4].sum() == 2 + 2 + 4  # steps 1, 2, 3 of one tree
    assert torch.allclose(state.edge_weight, torch.full((8,), 4 / 8))


def test_a_group_that_is_not_one_tree_is_refused():
    cfg = FlowGRPOConfig(tree_branch_steps=[1, 3], kl_beta=0.0)
    surrogate = FlowGRPOSurrogate(cfg)
    noise = torch.zeros(6, 2, 3, dtype=DT)
    with pytest.raises(RecipeError, match="rollout.group_size = 4"):
        surrogate.rollout(
            TinyAdapter(), noise, {"emb": torch.zeros(6, 2, dtype=DT)}, SamplerSpec("euler", 5), None
        )
    with pytest.raises(RecipeError, match="past rollout.steps"):
        surrogate.rollout(
            TinyAdapter(), noise[:4], {"emb": torch.zeros(4, 2, dtype=DT)}, SamplerSpec("euler", 3), None
        )
    with pytest.raises(ValueError, match="tree_branch_steps must be distinct"):
        FlowGRPOConfig(tree_branch_steps=[2, 1])
    with pytest.raises(ValueError, match="drop window_size"):
        FlowGRPOConfig(tree_branch_steps=[1], window_size=2)


def test_a_recipe_whose_groups_are_not_one_tree_is_refused_before_any_model_loads():
    with pytest.raises(RecipeError, match="one tree of 8 leaves, but rollout.group_size = 4"):
        resolve_recipe(TOY, ["surrogate.name='tree_grpo'", "rollout.group_size=4"])
    resolve_recipe(TOY, ["surrogate.name='tree_grpo'", "rollout.group_size=8"])  # 2^3 leaves: fine


def test_the_presets_are_treegrpo_and_branchgrpo():
    tg, bg = TreeGRPOConfig(), BranchGRPOConfig()
    assert tg.tree_advantage == "leaf_mean" and tg.tree_sde == "branch"
    assert bg.tree_advantage == "depth_norm" and bg.tree_sde == "all" and bg.diffusion == "constant"
    assert tree.leaf_count(tg.tree_branching, tg.tree_branch_steps) == 8  # the recipes' group size


@pytest.mark.parametrize("surrogate", ["tree_grpo", "branch_grpo"])
def test_tree_strategies_train_through_the_loop(tmp_path, surrogate):
    # groups of 4 = a tree branching twice; micro-batches of 2 rows: the rollout still sees whole trees
    records, trainer = surrogate_toy_run(tmp_path, surrogate, "surrogate.options={tree_branch_steps=[0, 3]}")
    assert len(records) == 2 and trainer.session.surrogate.rollout_block == 4
    for r in records:
        assert math.isfinite(r["loss"]) and r["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
