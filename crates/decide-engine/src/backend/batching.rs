//! Forming batches under a token budget.
//!
//! A padded batch costs `rows × longest row` tokens of compute, so rows are sorted by length
//! (similar lengths share a batch and padding stays small) and a batch is closed when one more
//! row would push that product over the budget, as text-embeddings-inference's queue does for
//! padded models. A batch is also closed when the next row is much shorter than its longest:
//! padding a 20-token tool description to a 256-token conversation would cost ten times its
//! own compute, so a batch never pads a row by more than a third of its longest row.
//!
//! The fused CPU path needs no padding at all: its attention runs over rows packed back to back
//! (text-embeddings-inference's "varlen" layout), so [`plan_packs`] only fills each pass up to a
//! token budget.

/// Groups row indices into batches: each batch's `len × longest` stays within
/// `max_batch_tokens` (a row longer than the budget gets a batch of its own). Every index
/// appears exactly once; within a batch rows are ordered longest first.
pub fn plan_batches(lengths: &[usize], max_batch_tokens: usize) -> Vec<Vec<usize>> {
    // Rows shorter than this share batches whatever their lengths: the padding is cheaper than
    // another pass through the layers.
    const SMALL: usize = 32;
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    // Stable sort: equal lengths keep their input order, so plans are deterministic.
    order.sort_by(|&a, &b| lengths[b].cmp(&lengths[a]));
    let mut batches: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut longest = 0;
    for i in order {
        let len = lengths[i].max(1);
        let new_longest = longest.max(len);
        let too_much_padding =
            (len >= SMALL && len * 4 < longest * 3) || (len < SMALL && longest > 2 * SMALL);
        if !current.is_empty()
            && ((current.len() + 1) * new_longest > max_batch_tokens || too_much_padding)
        {
            batches.push(std::mem::take(&mut current));
            longest = 0;
        }
        longest = longest.max(len);
        current.push(i);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

/// Groups rows for packed forward passes (no padding): longest first, each pass up to
/// `budget` tokens; a row longer than the budget goes alone. Returns row indexes per pass.
pub fn plan_packs(lengths: &[usize], budget: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by(|&a, &b| lengths[b].cmp(&lengths[a]));
    let mut packs: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut tokens = 0;
    for i in order {
        let len = lengths[i].max(1);
        if !current.is_empty() && tokens + len > budget {
            packs.push(std::mem::take(&mut current));
            tokens = 0;
        }
        tokens += len;
        current.push(i);
    }
    if !current.is_empty() {
        packs.push(current);
    }
    packs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_once_and_budget_kept() {
        let lengths: Vec<usize> = (0..100).map(|i| 5 + (i * 37) % 120).collect();
        let budget = 1000;
        let plan = plan_batches(&lengths, budget);
        let mut seen: Vec<usize> = plan.iter().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
        for batch in &plan {
            let longest = batch.iter().map(|&i| lengths[i]).max().unwrap();
            assert!(batch.len() * longest <= budget, "{batch:?}");
        }
    }

    #[test]
    fn sorting_keeps_padding_small() {
        let lengths = [10, 200, 12, 198, 11, 199];
        let plan = plan_batches(&lengths, 600);
        assert_eq!(plan, vec![vec![1, 5, 3], vec![2, 4, 0]]);
    }

    #[test]
    fn short_rows_do_not_share_a_batch_with_a_long_one() {
        let plan = plan_batches(&[256, 20, 25, 22, 190, 180], 1 << 20);
        assert_eq!(plan, vec![vec![0], vec![4, 5], vec![2, 3, 1]]);
    }

    #[test]
    fn a_row_longer_than_the_budget_runs_alone() {
        assert_eq!(plan_batches(&[500, 3], 100), vec![vec![0], vec![1]]);
        assert!(plan_batches(&[], 100).is_empty());
    }

    #[test]
    fn packs_hold_every_row_once_within_the_budget() {
        let lengths: Vec<usize> = (0..100)
            .map(|i| 5 + (i * 37) % 120)
            .chain([700, 3000])
            .collect();
        let budget = 1024;
        let plan = plan_packs(&lengths, budget);
        let mut seen: Vec<usize> = plan.iter().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>());
        for pack in &plan {
            let tokens: usize = pack.iter().map(|&i| lengths[i]).sum();
            assert!(
                tokens <= budget || pack.len() == 1,
                "{tokens} tokens in {pack:?}"
            );
        }
        // Filled, not padded: all but the last pass hold more than half the budget.
        for pack in &plan[..plan.len() - 1] {
            let tokens: usize = pack.iter().map(|&i| lengths[i]).sum();
            assert!(tokens > budget / 2, "{tokens}");
        }
        assert!(plan_packs(&[], budget).is_empty());
    }
}
