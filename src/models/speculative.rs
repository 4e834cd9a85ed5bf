//! The glue between these models and the decode loop of [`crate::spec`]: a [`Model`] is a
//! [`SequenceModel`] (so `Sequences<Model>` is a target), and [`GreedyDraft`] is a
//! [`DraftModel`] over any [`Model`] (a smaller model of the same tokenizer, or a layer-skip
//! draft of the target's own weights).

use crate::speculative::{DraftModel, Proposals, RowKind, SeqView, SequenceModel};

use super::generate::argmax;
use super::model::Model;

type SpecModelError = crate::speculative::ModelError;

impl SequenceModel for Model {
    fn vocab_size(&self) -> usize {
        Model::vocab_size(self)
    }

    fn len(&self) -> usize {
        Model::len(self)
    }

    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>, SpecModelError> {
        Ok(Model::forward(self, tokens)?)
    }

    fn forward_last(&mut self, tokens: &[u32], rows: usize) -> Result<Vec<f32>, SpecModelError> {
        Ok(Model::forward_last(self, tokens, rows)?)
    }

    fn truncate(&mut self, len: usize) -> Result<(), SpecModelError> {
        Ok(Model::truncate(self, len)?)
    }
}

/// A greedy drafter: per request slot, a fresh copy of a template [`Model`] (sharing its
/// weights) with its own cache, proposing the argmax continuation. Greedy drafts carry no rows
/// ([`RowKind::OneHot`]), which keeps verification exact at any temperature.
///
/// Between steps a sequence grows by the target's emitted tokens; the drafter keeps the common
/// prefix of what it fed and the new sequence, truncates the rest, and feeds the difference.
#[derive(Debug)]
pub struct GreedyDraft {
    template: Model,
    slots: Vec<Option<(Model, Vec<u32>)>>,
}

impl GreedyDraft {
    /// A drafter whose per-request models are empty clones of `template` (e.g.
    /// `Model::new(draft_weights)` or `Model::layer_skip(target_weights, n)`).
    pub fn new(mut template: Model) -> GreedyDraft {
        template.reset();
        GreedyDraft {
            template,
            slots: Vec::new(),
        }
    }

    /// Forgets every slot's cache (before reusing the drafter for new prompts).
    pub fn clear(&mut self) {
        self.slots.clear();
    }
}

impl DraftModel for GreedyDraft {
    fn row_kind(&self) -> RowKind {
        RowKind::OneHot
    }

    fn vocab_size(&self) -> usize {
        self.template.vocab_size()
    }

    fn propose(
        &mut self,
        seqs: &[SeqView<'_>],
        caps: &[usize],
        out: &mut Proposals,
    ) -> Result<(), SpecModelError> {
        let mut drafts = Vec::new();
        for (s, &cap) in seqs.iter().zip(caps) {
            drafts.clear();
            if cap == 0 || s.tokens.is_empty() {
                out.push(&[], &[])?;
                continue;
            }
            if self.slots.len() <= s.request {
                self.slots.resize_with(s.request + 1, || None);
            }
            let (model, fed) =
                self.slots[s.request].get_or_insert_with(|| (self.template.clone(), Vec::new()));
            // Keep the cached common prefix, but always feed at least the last token: its
            // logits give the first draft.
            let common = fed
                .iter()
                .zip(s.tokens)
                .take_while(|(a, b)| a == b)
                .count()
                .min(s.tokens.len() - 1);
            model.truncate(common)?;
            fed.truncate(common);
            let logits = model.forward_last(&s.tokens[common..], 1)?;
            fed.extend_from_slice(&s.tokens[common..]);
            drafts.push(argmax(&logits));
            while drafts.len() < cap {
                let last = drafts[drafts.len() - 1];
                let logits = model.forward(&[last])?;
                fed.push(last);
                drafts.push(argmax(&logits));
            }
            out.push(&drafts, &[])?;
        }
        Ok(())
    }
}
