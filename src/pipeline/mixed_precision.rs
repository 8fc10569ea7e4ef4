//! Mixed precision under a budget, as a multiple-choice knapsack solved exactly.
//!
//! Each slot has candidate choices (a bit width), each with a cost (bytes of weights,
//! activation bytes or bit operations; integers) and a loss (the sensitivity analysis's noise
//! at that width, which adds up across slots to first order). [`pareto_front`] merges the
//! slots one by one, keeping every choice of the slots so far that no other beats on both
//! cost and loss: the result is the exact Pareto front of total cost against total loss, and
//! [`solve`] picks from it the least loss within the budget. Dominated partial choices can
//! never be part of an optimum, so nothing is lost by dropping them; the front's size is
//! bounded by the number of distinct total costs.

use std::fmt;

/// One candidate of a slot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    /// What the choice is (a bit width).
    pub bits: u8,
    /// Its cost against the budget.
    pub cost: u64,
    /// Its loss (lower is better), finite and non-negative.
    pub loss: f64,
}

/// A choice for every slot, with its total cost and loss.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// Per slot, the index of its choice.
    pub choices: Vec<usize>,
    /// The total cost.
    pub cost: u64,
    /// The total loss.
    pub loss: f64,
}

/// Why no assignment could be found.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SolveError {
    /// A slot has no candidates.
    #[error("slot {slot} has no candidate bit widths")]
    NoChoices {
        /// The slot's index.
        slot: usize,
    },
    /// A loss is negative or not finite.
    #[error("slot {slot}, choice {choice}: loss {loss} is not a finite non-negative number")]
    BadLoss {
        /// The slot's index.
        slot: usize,
        /// The choice's index.
        choice: usize,
        /// The loss.
        loss: f64,
    },
    /// The budget is below the cheapest assignment.
    #[error("the budget {budget} is below the smallest possible total, {smallest}")]
    BelowSmallest {
        /// The budget.
        budget: u64,
        /// The cheapest assignment's cost.
        smallest: u64,
    },
}

/// A partial assignment on the front: its cost, loss, and choices (a persistent list, shared
/// between the front's entries, so merging stays linear in the front's size).
#[derive(Clone)]
struct Entry {
    cost: u64,
    loss: f64,
    path: Option<std::rc::Rc<Link>>,
}

struct Link {
    choice: usize,
    rest: Option<std::rc::Rc<Link>>,
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {})", self.cost, self.loss)
    }
}

fn choices_of(entry: &Entry, slots: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(slots);
    let mut at = entry.path.as_deref();
    while let Some(link) = at {
        out.push(link.choice);
        at = link.rest.as_deref();
    }
    out.reverse();
    out
}

fn check(slots: &[Vec<Choice>]) -> Result<(), SolveError> {
    for (slot, choices) in slots.iter().enumerate() {
        if choices.is_empty() {
            return Err(SolveError::NoChoices { slot });
        }
        for (choice, c) in choices.iter().enumerate() {
            if !(c.loss.is_finite() && c.loss >= 0.0) {
                return Err(SolveError::BadLoss {
                    slot,
                    choice,
                    loss: c.loss,
                });
            }
        }
    }
    Ok(())
}

/// Keeps the entries no other beats: sorted by cost, each with a loss strictly below every
/// cheaper one's (on equal cost and loss, the first found).
fn prune(mut entries: Vec<Entry>) -> Vec<Entry> {
    entries.sort_by(|a, b| a.cost.cmp(&b.cost).then(a.loss.total_cmp(&b.loss)));
    let mut front: Vec<Entry> = Vec::with_capacity(entries.len());
    for e in entries {
        if front.last().is_none_or(|last| e.loss < last.loss) {
            front.push(e);
        }
    }
    front
}

/// The exact Pareto front of total cost against total loss over every assignment of one
/// choice per slot, cheapest first (each entry strictly less loss than every cheaper one).
/// Costs above `cap` are dropped as they appear (pass `u64::MAX` for the whole front).
///
/// # Errors
/// A slot without candidates; a negative or non-finite loss.
pub fn pareto_front(slots: &[Vec<Choice>], cap: u64) -> Result<Vec<Assignment>, SolveError> {
    check(slots)?;
    let mut front = vec![Entry {
        cost: 0,
        loss: 0.0,
        path: None,
    }];
    for choices in slots {
        let mut next = Vec::with_capacity(front.len() * choices.len());
        for e in &front {
            for (i, c) in choices.iter().enumerate() {
                let Some(cost) = e.cost.checked_add(c.cost).filter(|&t| t <= cap) else {
                    continue;
                };
                next.push(Entry {
                    cost,
                    loss: e.loss + c.loss,
                    path: Some(std::rc::Rc::new(Link {
                        choice: i,
                        rest: e.path.clone(),
                    })),
                });
            }
        }
        front = prune(next);
    }
    Ok(front
        .iter()
        .map(|e| Assignment {
            choices: choices_of(e, slots.len()),
            cost: e.cost,
            loss: e.loss,
        })
        .collect())
}

/// The assignment of least total loss whose total cost is within `budget` (the cheapest
/// such on ties).
///
/// # Errors
/// See [`pareto_front`]; [`SolveError::BelowSmallest`] when even the cheapest assignment
/// costs more than `budget`.
pub fn solve(slots: &[Vec<Choice>], budget: u64) -> Result<Assignment, SolveError> {
    check(slots)?;
    let front = pareto_front(slots, budget)?;
    // The front is sorted by cost with strictly falling loss: its last entry is the best.
    front
        .last()
        .cloned()
        .ok_or_else(|| SolveError::BelowSmallest {
            budget,
            smallest: slots
                .iter()
                .map(|c| c.iter().map(|c| c.cost).min().unwrap_or(0))
                .fold(0u64, u64::saturating_add),
        })
}
