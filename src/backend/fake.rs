//! A driver for the operations' unit tests ([`FakeDriver`]): tables held in memory, every
//! call recorded, a failure on demand. No process, no kernel, no tool looked for: a test of
//! `ops` is hermetic on it. What a real driver does at the process level (restore batches,
//! `-C` checks, a rewrite's `-F`) is tested in the driver's own tests.

use std::sync::Mutex;

use crate::model::capabilities::Capabilities;
use crate::model::family::Family;
use crate::model::layout::{Owner, is_owned_chain, owner};
use crate::model::oci::ContainerId;
use crate::model::rule::Rule;
use crate::model::save::{self, Batch, Op, SavedRule};
use crate::model::table::Table;
use crate::state::ledger::RuleRecord;

use super::driver::Primitives;
use super::remove::{Deleted, Plan};
use super::write::{InstallError, placements, push_rules};
use super::{Backend, BackendError, Driver, Netfilter, Reading};

/// One call the operations made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Read(Family, String),
    ReadAll(Family),
    Install(Family, usize),
    Remove(Family, Vec<Table>),
    ApplyPlan(Family, String),
    DropIfEmptied(Family, String),
}

/// A driver over in-memory tables (one [`save::Dump`] per family and table).
pub struct FakeDriver {
    backend: Backend,
    caps: Capabilities,
    tables: Mutex<Vec<(Family, save::Dump)>>,
    calls: Mutex<Vec<Call>>,
    /// The (family, table) whose every read and change fails.
    failing: Mutex<Vec<(Family, String)>>,
    /// Run after each install (a test's way to change the world in between).
    after_install: Mutex<Option<Box<dyn FnMut() + Send>>>,
}

impl FakeDriver {
    /// An empty fake of `backend`, with the real driver's capabilities.
    pub fn new(backend: Backend) -> Self {
        FakeDriver {
            backend,
            caps: backend.driver().capabilities(),
            tables: Mutex::new(Vec::new()),
            calls: Mutex::new(Vec::new()),
            failing: Mutex::new(Vec::new()),
            after_install: Mutex::new(None),
        }
    }

    /// Run `f` after each install from now on.
    pub fn after_install(&self, f: impl FnMut() + Send + 'static) {
        *self.after_install.lock().unwrap() = Some(Box::new(f));
    }

    /// Make every read and change of `table` in `family` fail from now on.
    pub fn fail(&self, family: Family, table: &str) {
        self.failing
            .lock()
            .unwrap()
            .push((family, table.to_string()));
    }

    /// The calls made so far.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// Replace the tables of `family` with those of a saved dump (as another program left
    /// them).
    pub fn load(&self, family: Family, dump: &str) {
        let mut tables = self.tables.lock().unwrap();
        tables.retain(|(f, _)| *f != family);
        let parsed = save::parse_dump(dump).expect("a test's dump parses");
        tables.extend(parsed.into_iter().map(|t| (family, t)));
    }

    /// The chains of `table` in `family`.
    pub fn chains(&self, family: Family, table: &str) -> Vec<String> {
        let found = self.table(family, table).unwrap_or_default();
        found.chains.into_iter().map(|(c, _)| c).collect()
    }

    /// The calls made so far, forgotten.
    pub fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }

    /// The rules, in any family and table, whose line holds `text`.
    pub fn holding(&self, text: &str) -> usize {
        let tables = self.tables.lock().unwrap();
        let rules = tables.iter().flat_map(|(_, t)| &t.rules);
        rules.filter(|r| r.args.iter().any(|a| a == text)).count()
    }

    /// The rules of `table` in `family`, as `-A CHAIN args` lines.
    pub fn lines(&self, family: Family, table: &str) -> Vec<String> {
        let tables = self.tables.lock().unwrap();
        let found = tables.iter().find(|(f, t)| *f == family && t.name == table);
        found.map_or_else(Vec::new, |(_, t)| {
            (t.rules.iter())
                .map(|r| format!("-A {} {}", r.chain, r.args.join(" ")))
                .collect()
        })
    }

    /// Apply `batch` as one transaction: all or nothing.
    pub fn apply(&self, family: Family, batch: &Batch) -> Result<(), BackendError> {
        self.check(family, batch.table)?;
        let mut tables = self.tables.lock().unwrap();
        let at = match tables
            .iter()
            .position(|(f, t)| *f == family && t.name == batch.table)
        {
            Some(at) => at,
            None => {
                let table = save::Dump {
                    name: batch.table.to_string(),
                    ..Default::default()
                };
                tables.push((family, table));
                tables.len() - 1
            }
        };
        let mut table = tables[at].1.clone();
        for op in &batch.ops {
            apply_op(&mut table, op).map_err(|what| failed(family, batch.table, &what))?;
        }
        tables[at].1 = table;
        Ok(())
    }

    fn call(&self, call: Call) {
        self.calls.lock().unwrap().push(call);
    }

    fn check(&self, family: Family, table: &str) -> Result<(), BackendError> {
        let failing = self.failing.lock().unwrap();
        match failing.iter().any(|(f, t)| *f == family && t == table) {
            true => Err(failed(family, table, "failing on demand")),
            false => Ok(()),
        }
    }

    fn table(&self, family: Family, table: &str) -> Option<save::Dump> {
        let tables = self.tables.lock().unwrap();
        let found = tables.iter().find(|(f, t)| *f == family && t.name == table);
        found.map(|(_, t)| t.clone())
    }

    /// One table of [`Driver::remove`]: what is recorded (once per copy) or tagged for `id`
    /// in natledger's chains goes; whether every record was found, and what went.
    fn remove_table(
        &self,
        family: Family,
        table: Table,
        id: &ContainerId,
        recorded: &[&RuleRecord],
    ) -> Result<(bool, Vec<SavedRule>), BackendError> {
        let Some(dump) = self.table(family, table.as_str()) else {
            return Ok((recorded.is_empty(), Vec::new()));
        };
        let mut unseen: Vec<(&str, Vec<String>)> = recorded
            .iter()
            .map(|r| (r.chain.as_str(), r.args().into_owned()))
            .collect();
        let mut batch = Batch::new(table.as_str());
        let mut gone = Vec::new();
        for saved in dump.rules.iter().filter(|r| is_owned_chain(&r.chain)) {
            let at = unseen
                .iter()
                .position(|(c, a)| *c == saved.chain && *a == saved.args);
            let tagged = owner(&saved.chain, &saved.args) == Owner::Container(id.as_str());
            if let Some(at) = at {
                unseen.swap_remove(at);
            } else if !tagged {
                continue;
            }
            batch
                .ops
                .push(Op::Delete(saved.chain.clone(), saved.args.clone()));
            gone.push(saved.clone());
        }
        self.apply(family, &batch)?;
        Ok((unseen.is_empty(), gone))
    }
}

/// The fake's one transaction: its in-memory tables; it has no direct paths, and its three
/// changes are its own (below), so the shared strategies never reach it.
impl Primitives for FakeDriver {
    fn apply_batches(
        &self,
        _nf: &Netfilter,
        family: Family,
        batches: &[Batch],
    ) -> Result<(), BackendError> {
        batches.iter().try_for_each(|b| self.apply(family, b))
    }
}

impl Driver for FakeDriver {
    fn backend(&self) -> Backend {
        self.backend
    }

    fn capabilities(&self) -> Capabilities {
        self.caps
    }

    fn read(
        &self,
        _nf: &Netfilter,
        family: Family,
        table: &str,
        _scope: Reading,
    ) -> Result<Option<save::Dump>, BackendError> {
        self.call(Call::Read(family, table.to_string()));
        self.check(family, table)?;
        Ok(self.table(family, table))
    }

    fn read_all(&self, _nf: &Netfilter, family: Family) -> Result<Vec<save::Dump>, BackendError> {
        self.call(Call::ReadAll(family));
        let tables = self.tables.lock().unwrap();
        let here = tables.iter().filter(|(f, _)| *f == family);
        Ok(here.map(|(_, t)| t.clone()).collect())
    }

    /// Per table (filter, then nat) its chains and the rules where a real driver puts them;
    /// a failing filter table is skipped (returned), a failing nat table an error.
    fn install(
        &self,
        _nf: &Netfilter,
        family: Family,
        rules: &[&RuleRecord],
    ) -> Result<Vec<Table>, InstallError> {
        self.call(Call::Install(family, rules.len()));
        let (mut partial, mut skipped) = (false, Vec::new());
        for table in Table::ALL {
            let here: Vec<&RuleRecord> = rules.iter().copied().filter(|r| r.is_in(table)).collect();
            if here.is_empty() {
                continue;
            }
            let mut batch = Batch::new(table.as_str());
            for r in &here {
                batch.ops.push(Op::DeclareChain(r.chain.clone()));
            }
            push_rules(&mut batch, &placements(&here));
            match self.apply(family, &batch) {
                Ok(()) => partial = true,
                // As the real drivers: a filter table not written costs only the accept.
                Err(_) if table == Table::Filter => skipped.push(table),
                Err(error) => return Err(InstallError { error, partial }),
            }
        }
        if let Some(f) = self.after_install.lock().unwrap().as_mut() {
            f();
        }
        Ok(skipped)
    }

    /// Nat first; a failing nat table keeps the filter table as it is.
    fn remove(
        &self,
        _nf: &Netfilter,
        family: Family,
        id: &ContainerId,
        tables: &[Table],
        recorded: &[&RuleRecord],
    ) -> Deleted {
        self.call(Call::Remove(family, tables.to_vec()));
        let mut found = Deleted::default();
        let mut nat_failed = false;
        for &table in tables {
            if nat_failed && table == Table::Filter {
                continue;
            }
            let here: Vec<&RuleRecord> = recorded
                .iter()
                .copied()
                .filter(|r| r.is_in(table))
                .collect();
            match self.remove_table(family, table, id, &here) {
                Ok((complete, gone)) => {
                    found.deleted += gone.len();
                    if complete {
                        found.complete.push(table);
                    }
                    let typed = gone.iter().filter_map(|r| Rule::parse_args(&r.args).ok());
                    found.rules.extend(typed);
                }
                Err(e) => {
                    nat_failed |= table == Table::Nat;
                    found.failures.push(e);
                }
            }
        }
        found
    }

    fn apply_plan(&self, _nf: &Netfilter, family: Family, plan: &Plan) -> Result<(), BackendError> {
        match plan {
            Plan::Batch { batch, .. } => {
                self.call(Call::ApplyPlan(family, batch.table.to_string()));
                self.apply(family, batch)
            }
            Plan::DropIfEmptied { table } => {
                self.call(Call::DropIfEmptied(family, table.to_string()));
                Ok(())
            }
        }
    }
}

/// A failure of the fake, as a restore's would read.
fn failed(family: Family, table: &str, what: &str) -> BackendError {
    BackendError::Failed {
        command: format!("fake {family} {table}"),
        code: "1".into(),
        stderr: what.to_string(),
        line: None,
    }
}

/// One operation on `table`, as `*-restore` would do it; what it refuses, said.
fn apply_op(table: &mut save::Dump, op: &Op) -> Result<(), String> {
    let rule = |chain: &str, args: &[String]| SavedRule {
        chain: chain.to_string(),
        args: args.to_vec(),
        counters: None,
    };
    let first = |t: &save::Dump, chain: &str| t.rules.iter().position(|r| r.chain == chain);
    let last = |t: &save::Dump, chain: &str| t.rules.iter().rposition(|r| r.chain == chain);
    let find = |t: &save::Dump, chain: &str, args: &[String]| {
        (t.rules.iter()).position(|r| r.chain == chain && r.args == args)
    };
    match op {
        Op::DeclareChain(chain) => {
            if !table.has_chain(chain) {
                table.chains.push((chain.clone(), "-".into()));
            }
        }
        Op::Check(chain, args) => {
            find(table, chain, args).ok_or(format!("-C {chain}: no such rule"))?;
        }
        Op::InsertFirst(chain, args) | Op::InsertAt(chain, _, args) => {
            let at = first(table, chain).unwrap_or(table.rules.len());
            table.rules.insert(at, rule(chain, args));
        }
        Op::Append(chain, args) => {
            let at = last(table, chain).map_or(table.rules.len(), |at| at + 1);
            table.rules.insert(at, rule(chain, args));
        }
        Op::Delete(chain, args) => {
            let at = find(table, chain, args).ok_or(format!("-D {chain}: no such rule"))?;
            table.rules.remove(at);
        }
        Op::Flush(chain) => table.rules.retain(|r| r.chain != *chain),
        Op::DeleteChain(chain) => {
            table.rules.retain(|r| r.chain != *chain);
            table.chains.retain(|(c, _)| c != chain);
        }
        Op::Policy(chain, policy) => match table.chains.iter_mut().find(|(c, _)| c == chain) {
            Some((_, p)) => *p = policy.clone(),
            None => table.chains.push((chain.clone(), policy.clone())),
        },
    }
    Ok(())
}
