//! The host's ledger of a session: the token timeline it holds, the generation it was last
//! seen at, and the sync plan for a new prompt (what stays, where to rewind, what to
//! prefill). Checkpoints record (generation, position); a generation change makes every
//! older checkpoint stale, as the contract says.
use crate::error::{Error, Result};
use crate::session::Session;

/// What bringing a session to `prompt` costs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncPlan {
    /// Length of the common prefix of the timeline and the prompt.
    pub common: usize,
    /// Tokens kept: the common prefix, less one when the prompt ends inside it (its last
    /// token is evaluated again so the next logits are fresh); all of it when the session
    /// already holds exactly the prompt.
    pub keep: usize,
    /// Whether positions are dropped (keep < timeline length), which bumps the generation.
    pub rewinds: bool,
    /// Tokens to prefill: prompt[keep..].
    pub prefill: usize,
}

/// A point of the timeline that can be returned to while the generation is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub generation: u64,
    pub pos: usize,
}

#[derive(Clone, Debug, Default)]
pub struct Ledger {
    timeline: Vec<i32>,
    generation: u64,
}

impl Ledger {
    /// The ledger of a session as it is now (which must be empty or just created).
    pub fn new(s: &Session<'_>) -> Result<Ledger> {
        if s.pos() != 0 {
            return Err(Error::new("ledger: start it on an empty session"));
        }
        Ok(Ledger { timeline: Vec::new(), generation: s.generation() })
    }

    pub fn timeline(&self) -> &[i32] {
        &self.timeline
    }
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The plan for making the session hold exactly `prompt` (non-empty).
    pub fn plan(&self, prompt: &[i32]) -> SyncPlan {
        let common = self.timeline.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        if common == prompt.len() && common == self.timeline.len() {
            // Already there (a non-empty timeline always has its logits): nothing to do.
            return SyncPlan { common, keep: common, rewinds: false, prefill: 0 };
        }
        let keep = common.min(prompt.len().saturating_sub(1));
        SyncPlan { common, keep, rewinds: keep < self.timeline.len(), prefill: prompt.len() - keep }
    }

    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint { generation: self.generation, pos: self.timeline.len() }
    }

    /// Whether a checkpoint still describes this timeline.
    pub fn is_live(&self, c: &Checkpoint) -> bool {
        c.generation == self.generation && c.pos <= self.timeline.len()
    }

    /// Brings the session to `prompt` by the plan: an explicit rewind to `keep` when it
    /// drops positions, then the prefill. Returns the plan it followed.
    pub fn sync(&mut self, s: &mut Session<'_>, prompt: &[i32]) -> Result<SyncPlan> {
        self.expect_in_step(s)?;
        if prompt.is_empty() {
            return Err(Error::new("ledger: empty prompt"));
        }
        let plan = self.plan(prompt);
        if plan.prefill == 0 {
            return Ok(plan);
        }
        if plan.rewinds {
            self.rewind(s, plan.keep)?;
        }
        let r = s.sync(prompt);
        self.resync(s, prompt, r.is_ok())?;
        r.map(|_| plan)
    }

    pub fn eval(&mut self, s: &mut Session<'_>, token: i32) -> Result<()> {
        self.expect_in_step(s)?;
        let r = s.eval(token);
        let mut t = self.timeline.clone();
        t.push(token);
        self.resync(s, &t, r.is_ok())?;
        r
    }

    pub fn rewind(&mut self, s: &mut Session<'_>, pos: usize) -> Result<()> {
        self.expect_in_step(s)?;
        s.rewind(pos as i32)?;
        if pos < self.timeline.len() {
            self.timeline.truncate(pos);
            self.generation = s.generation();
        }
        Ok(())
    }

    // The session must be where the ledger left it: same length, same generation.
    fn expect_in_step(&self, s: &Session<'_>) -> Result<()> {
        if s.pos() as usize != self.timeline.len() || s.generation() != self.generation {
            return Err(Error::new(format!(
                "ledger out of step: it holds {} tokens at generation {}, the session {} at {}",
                self.timeline.len(),
                self.generation,
                s.pos(),
                s.generation()
            )));
        }
        Ok(())
    }

    // After an operation: on success the timeline is `want`; on failure the engine either
    // left the session as it was or invalidated it (pos 0, new generation).
    fn resync(&mut self, s: &Session<'_>, want: &[i32], ok: bool) -> Result<()> {
        if ok {
            if s.pos() as usize != want.len() {
                return Err(Error::new("ledger: the session does not hold the tokens it was given"));
            }
            self.timeline = want.to_vec();
        } else if s.generation() != self.generation {
            self.timeline.truncate(s.pos().max(0) as usize);
        }
        self.generation = s.generation();
        Ok(())
    }
}
