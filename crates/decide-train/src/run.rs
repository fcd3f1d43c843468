//! A whole run: the epochs, a checkpoint after each (calibrated and measured through the
//! caller's [`RunObserver`]), the best one kept in the output folder, early stopping, and the
//! caller's say on stopping between two steps.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use decide_engine::Calibration;

use crate::error::TrainError;
use crate::export::{write_manifest, ModelMeta};
use crate::trainer::{StepReport, Trainer};

/// Which epochs a run goes through, where it keeps the best one and when it stops early.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// The folder the kept model ends in: an existing one is replaced. Each checkpoint is
    /// written beside it first ([`beside`] with `partial`) and renamed into place only when
    /// kept, so the folder always holds a complete model, also after the run is stopped.
    pub out: PathBuf,
    /// The last epoch to run: [`Hyper::epochs`](crate::Hyper::epochs) or fewer (the learning
    /// rate still follows the whole schedule).
    pub last_epoch: usize,
    /// How many measured epochs in a row may miss the best score before the run stops.
    pub patience: usize,
}

/// Where a run is after one step.
#[derive(Debug, Clone, Copy)]
pub struct StepProgress<'a> {
    /// The epoch, from 1.
    pub epoch: usize,
    /// What the step did.
    pub step: &'a StepReport,
    /// The mean loss of the epoch's steps so far.
    pub epoch_loss: f64,
}

/// How an epoch ended.
#[derive(Debug, Clone, Copy)]
pub struct EpochEnd {
    /// The epoch, from 1.
    pub epoch: usize,
    /// The mean loss of its steps.
    pub loss: f64,
    /// The Platt scaling fitted to its checkpoint.
    pub calibration: Calibration,
    /// What [`RunObserver::measure`] said of it.
    pub score: Option<f64>,
    /// Whether it is now the model in [`Schedule::out`].
    pub kept: bool,
}

/// How a run ended.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The epoch whose model is in [`Schedule::out`]; `None` when none was kept.
    pub kept_epoch: Option<usize>,
    /// The epoch [`RunObserver::on_step`] stopped, if it did.
    pub interrupted_in: Option<usize>,
    /// The time spent in complete epochs (hard-negative mining included, checkpoints and
    /// measuring not).
    pub training_time: Duration,
    /// The (query, tool) pairs trained on, over all steps.
    pub pairs_trained: u64,
}

/// What a run asks of its caller: what it knows of the data the model is for (the held-out
/// cases) and what it shows while the run goes.
pub trait RunObserver {
    /// The caller's error; the run's own errors convert into it.
    type Error: From<TrainError>;

    /// After every step. [`ControlFlow::Break`] stops the run before the next step; the
    /// current epoch's checkpoint is not written.
    fn on_step(&mut self, progress: &StepProgress<'_>) -> ControlFlow<()>;

    /// The raw scores and labels (needed or not) to fit the checkpoint's calibration on: the
    /// (case, tool) pairs of held-out cases as the model in `checkpoint`, not yet calibrated,
    /// scores them. They need both labels.
    fn calibration_pairs(
        &mut self,
        checkpoint: &Path,
    ) -> Result<(Vec<f64>, Vec<bool>), Self::Error>;

    /// The calibrated model in `checkpoint` measured, higher being better; `None` when there
    /// is nothing to measure it on, and then every epoch is kept and the run never stops early.
    fn measure(&mut self, checkpoint: &Path) -> Result<Option<f64>, Self::Error>;

    /// After each complete epoch, once its checkpoint is kept or thrown away.
    fn on_epoch_end(&mut self, end: &EpochEnd);

    /// The run stops early: `patience` measured epochs in a row missed the best score.
    fn on_early_stop(&mut self, patience: usize);
}

impl Trainer {
    /// Runs the epochs of `schedule`. After each one the weights are written with `meta`
    /// (its `[training]` table gains `epoch`, `epochs_run` and `loss`) to a scratch folder
    /// beside [`Schedule::out`], calibrated on the observer's pairs, measured, and moved into
    /// `out` when they score better than every epoch before (always, without a measure).
    /// Stopped by the observer, the run returns at once with
    /// [`Outcome::interrupted_in`] set and `out` holding the last kept epoch.
    pub fn run<O: RunObserver>(
        &mut self,
        schedule: &Schedule,
        meta: &mut ModelMeta,
        observer: &mut O,
    ) -> Result<Outcome, O::Error> {
        // Named for this run only: whatever is at the path was made by this run, and only this
        // run deletes it.
        let scratch = beside_or_error(&schedule.out, "partial")?;
        let mut outcome = Outcome::default();
        let mut best: Option<f64> = None;
        let mut since_best = 0;
        for epoch in 1..=schedule.last_epoch {
            let Some(loss) = self.train_epoch(epoch, &mut outcome, observer)? else {
                let _ = std::fs::remove_dir_all(&scratch);
                outcome.interrupted_in = Some(epoch);
                return Ok(outcome);
            };
            let calibration = self.checkpoint(epoch, loss, meta, &scratch, observer)?;
            let score = observer.measure(&scratch)?;
            let kept = match score {
                Some(s) => best.is_none_or(|b| s > b),
                None => true,
            };
            if kept {
                best = score;
                publish(&scratch, &schedule.out)?;
                outcome.kept_epoch = Some(epoch);
                since_best = 0;
            } else {
                let _ = std::fs::remove_dir_all(&scratch);
                since_best += 1;
            }
            observer.on_epoch_end(&EpochEnd {
                epoch,
                loss,
                calibration,
                score,
                kept,
            });
            if score.is_some() && since_best >= schedule.patience {
                observer.on_early_stop(schedule.patience);
                break;
            }
        }
        Ok(outcome)
    }

    /// One epoch with the observer told of every step: its mean loss, or `None` when the
    /// observer stopped it.
    fn train_epoch<O: RunObserver>(
        &mut self,
        epoch: usize,
        outcome: &mut Outcome,
        observer: &mut O,
    ) -> Result<Option<f64>, O::Error> {
        let started = Instant::now();
        let mut loss_sum = 0.0;
        let mut steps = 0;
        let complete = self.run_epoch(&mut |step| {
            loss_sum += step.loss as f64;
            steps += 1;
            outcome.pairs_trained += step.examples as u64;
            observer.on_step(&StepProgress {
                epoch,
                step,
                epoch_loss: loss_sum / steps as f64,
            })
        })?;
        if !complete {
            return Ok(None);
        }
        outcome.training_time += started.elapsed();
        Ok(Some(loss_sum / steps.max(1) as f64))
    }

    /// Writes the epoch's model to `scratch`, then fits its calibration on the observer's pairs
    /// and writes the manifest again with it.
    fn checkpoint<O: RunObserver>(
        &self,
        epoch: usize,
        loss: f64,
        meta: &mut ModelMeta,
        scratch: &Path,
        observer: &mut O,
    ) -> Result<Calibration, O::Error> {
        meta.calibration = None;
        meta.training
            .insert("epochs_run".into(), (epoch as i64).into());
        meta.training.insert("epoch".into(), (epoch as i64).into());
        meta.training.insert("loss".into(), loss.into());
        self.save(scratch, meta)?;
        let (scores, labels) = observer.calibration_pairs(scratch)?;
        let Some(fit) = Calibration::fit(&scores, &labels) else {
            return Err(TrainError::BadData(
                "calibration needs both needed and unneeded tools among the held-out cases".into(),
            )
            .into());
        };
        meta.calibration = Some(fit);
        write_manifest(scratch, meta)?;
        Ok(fit)
    }
}

/// A path beside `path` named after it: its file name with `suffix` and this process's id
/// appended (never replacing an extension: `model.v2` gives `model.v2.partial-PID`, not
/// `model.partial`), so it cannot be a file of the user's, and this run may delete it. `None`
/// when `path` has no file name (`/`, `..`).
pub fn beside(path: &Path, suffix: &str) -> Option<PathBuf> {
    let mut name = path.file_name()?.to_os_string();
    name.push(format!(".{suffix}-{}", std::process::id()));
    Some(path.with_file_name(name))
}

fn beside_or_error(path: &Path, suffix: &str) -> crate::Result<PathBuf> {
    beside(path, suffix).ok_or_else(|| TrainError::bad_file(path, "needs a folder name"))
}

/// Moves the checkpoint in `scratch` to `out`, replacing what was there: `out` is moved aside,
/// the checkpoint renamed into its place, and only then is the old one removed, so `out` is
/// never half written.
fn publish(scratch: &Path, out: &Path) -> crate::Result<()> {
    let failed = |e| TrainError::bad_file(out, e);
    if !out.exists() {
        return std::fs::rename(scratch, out).map_err(failed);
    }
    let old = beside_or_error(out, "old")?;
    std::fs::rename(out, &old).map_err(failed)?;
    if let Err(e) = std::fs::rename(scratch, out) {
        let _ = std::fs::rename(&old, out);
        return Err(failed(e));
    }
    std::fs::remove_dir_all(&old).map_err(|e| TrainError::bad_file(&old, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Hyper, TrainHead};
    use crate::data::{Example, TrainData};
    use candle_core::Device;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../decide-engine/fixtures/tiny-bert-1")
    }

    fn trainer(epochs: usize) -> Trainer {
        let topics = ["weather", "email", "calendar", "search"];
        let data = TrainData {
            documents: topics.iter().map(|t| format!("{t}: a tool")).collect(),
            examples: topics
                .iter()
                .enumerate()
                .map(|(i, t)| Example {
                    query: format!("please help me with {t}"),
                    positives: vec![i],
                    candidates: Vec::new(),
                })
                .collect(),
        };
        let hyper = Hyper {
            epochs,
            learning_rate: 1e-2,
            batch_size: 2,
            max_length: 16,
            seed: 1,
            hard_negative_pool: 1,
            ..Hyper::default()
        };
        Trainer::new(&fixture(), data, hyper, &Device::Cpu).unwrap()
    }

    fn meta() -> ModelMeta {
        ModelMeta {
            name: "tiny".into(),
            base_hf_id: "local/tiny-bert-1".into(),
            base: fixture().display().to_string(),
            head: TrainHead::BiEncoder,
            max_length: 16,
            license: None,
            lexical_weight: None,
            tool_parameters: false,
            tool_server: false,
            calibration: None,
            training: toml::Table::new(),
        }
    }

    /// Answers with scripted scores, stops at a scripted (epoch, step), and notes what it saw.
    #[derive(Default)]
    struct Script {
        scores: Vec<Option<f64>>,
        labels: Vec<bool>,
        stop_at: Option<(usize, usize)>,
        steps: usize,
        measured: usize,
        ends: Vec<(usize, bool)>,
        early_stop: Option<usize>,
    }

    impl RunObserver for Script {
        type Error = TrainError;

        fn on_step(&mut self, p: &StepProgress<'_>) -> ControlFlow<()> {
            self.steps += 1;
            assert!(p.epoch_loss.is_finite() && p.step.examples > 0);
            match self.stop_at {
                Some(at) if at == (p.epoch, p.step.step) => ControlFlow::Break(()),
                _ => ControlFlow::Continue(()),
            }
        }

        fn calibration_pairs(&mut self, checkpoint: &Path) -> crate::Result<(Vec<f64>, Vec<bool>)> {
            // Uncalibrated until the fit is written.
            let m = decide_engine::Manifest::read_from(checkpoint)?.unwrap();
            assert!(m.calibration.is_none());
            let scores = (0..self.labels.len()).map(|i| i as f64 / 10.0).collect();
            Ok((scores, self.labels.clone()))
        }

        fn measure(&mut self, checkpoint: &Path) -> crate::Result<Option<f64>> {
            let m = decide_engine::Manifest::read_from(checkpoint)?.unwrap();
            assert!(m.calibration.is_some());
            self.measured += 1;
            Ok(self.scores.get(self.measured - 1).copied().flatten())
        }

        fn on_epoch_end(&mut self, end: &EpochEnd) {
            self.ends.push((end.epoch, end.kept));
        }

        fn on_early_stop(&mut self, patience: usize) {
            self.early_stop = Some(patience);
        }
    }

    fn labels() -> Vec<bool> {
        vec![false, true, false, true]
    }

    /// A fresh folder for a test's `out`, and the `out` inside it.
    fn out_in(name: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("decide-run-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("model.v2");
        (dir, out)
    }

    /// The epoch the model in `out` was saved at, and whether it is calibrated.
    fn saved(out: &Path) -> (i64, bool) {
        let m = decide_engine::Manifest::read_from(out).unwrap().unwrap();
        let epoch = m.training.unwrap()["epoch"].as_integer().unwrap();
        (epoch, m.calibration.is_some())
    }

    /// Only `out` is left in its folder: no checkpoint, no replaced model.
    fn only_out(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn the_best_measured_epoch_is_kept_and_patience_stops_the_run() {
        let (dir, out) = out_in("best");
        let mut t = trainer(6);
        let mut script = Script {
            scores: vec![Some(0.5), Some(0.4), Some(0.6), Some(0.6), Some(0.5)],
            labels: labels(),
            ..Script::default()
        };
        let schedule = Schedule {
            out: out.clone(),
            last_epoch: 6,
            patience: 2,
        };
        let mut meta = meta();
        let outcome = t.run(&schedule, &mut meta, &mut script).unwrap();
        // Epoch 2 misses epoch 1's score, epoch 3 beats it; epoch 4 only ties it and epoch 5
        // misses it too, which stops the run before epoch 6.
        assert_eq!(
            script.ends,
            vec![(1, true), (2, false), (3, true), (4, false), (5, false)]
        );
        assert_eq!(script.early_stop, Some(2));
        assert_eq!(outcome.kept_epoch, Some(3));
        assert_eq!(outcome.interrupted_in, None);
        assert_eq!(script.steps, 10);
        assert_eq!(outcome.pairs_trained, 20);
        assert_eq!(saved(&out), (3, true));
        assert_eq!(meta.training["epochs_run"].as_integer(), Some(5));
        assert_eq!(only_out(&dir), vec!["model.v2"]);

        // Patience 0 stops after the first measured epoch, kept or not.
        let (_, out) = out_in("patience-0");
        let mut script = Script {
            scores: vec![Some(0.5)],
            labels: labels(),
            ..Script::default()
        };
        let schedule = Schedule {
            out: out.clone(),
            last_epoch: 3,
            patience: 0,
        };
        let outcome = trainer(3).run(&schedule, &mut meta, &mut script).unwrap();
        assert_eq!(script.ends, vec![(1, true)]);
        assert_eq!(outcome.kept_epoch, Some(1));
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(out.parent().unwrap()).unwrap();
    }

    #[test]
    fn without_a_measure_every_epoch_is_kept_until_the_last() {
        let (dir, out) = out_in("unmeasured");
        let mut script = Script {
            labels: labels(),
            ..Script::default()
        };
        // Patience counts measured epochs only.
        let schedule = Schedule {
            out: out.clone(),
            last_epoch: 2,
            patience: 0,
        };
        let outcome = trainer(3).run(&schedule, &mut meta(), &mut script).unwrap();
        assert_eq!(script.ends, vec![(1, true), (2, true)]);
        assert_eq!(script.early_stop, None);
        assert_eq!(outcome.kept_epoch, Some(2));
        assert_eq!(saved(&out), (2, true));
        assert_eq!(only_out(&dir), vec!["model.v2"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_stopped_run_keeps_the_last_kept_epoch() {
        let (dir, out) = out_in("stopped");
        // Steps count over the run: step 3 is epoch 2's first.
        let mut script = Script {
            labels: labels(),
            stop_at: Some((2, 3)),
            ..Script::default()
        };
        let schedule = Schedule {
            out: out.clone(),
            last_epoch: 3,
            patience: 2,
        };
        let outcome = trainer(3).run(&schedule, &mut meta(), &mut script).unwrap();
        assert_eq!(outcome.interrupted_in, Some(2));
        assert_eq!(outcome.kept_epoch, Some(1));
        assert_eq!(script.ends, vec![(1, true)]);
        assert_eq!(saved(&out), (1, true));
        assert_eq!(only_out(&dir), vec!["model.v2"]);

        // Stopped in the first epoch, nothing is written.
        let _ = std::fs::remove_dir_all(&out);
        let mut script = Script {
            labels: labels(),
            stop_at: Some((1, 1)),
            ..Script::default()
        };
        let outcome = trainer(3).run(&schedule, &mut meta(), &mut script).unwrap();
        assert_eq!(
            (outcome.interrupted_in, outcome.kept_epoch),
            (Some(1), None)
        );
        assert!(only_out(&dir).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_calibration_needs_both_labels() {
        let (dir, out) = out_in("one-label");
        let mut script = Script {
            labels: vec![true, true],
            ..Script::default()
        };
        let schedule = Schedule {
            out,
            last_epoch: 1,
            patience: 1,
        };
        let err = trainer(1)
            .run(&schedule, &mut meta(), &mut script)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "calibration needs both needed and unneeded tools among the held-out cases"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn beside_appends_to_the_name() {
        let p = beside(Path::new("/tmp/model.v2"), "partial").unwrap();
        assert_eq!(
            p,
            PathBuf::from(format!("/tmp/model.v2.partial-{}", std::process::id()))
        );
        assert!(beside(Path::new("/"), "partial").is_none());
    }
}
