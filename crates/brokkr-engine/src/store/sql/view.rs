//! The view of recently changed resources: what a SQLite store's `get` and `get_status` (every
//! `last_operation`) answer from without a read transaction, and a PostgreSQL store's
//! `last_operation` without a round trip.
//!
//! A read on a reader connection starts a transaction: SQLite takes its shared lock, checks the
//! WAL index and, when anything was committed since that connection's last read, drops its page
//! cache and reads every page again. On a busy broker, most reads ask about operations this
//! process is running, whose rows the writer thread has just written. So within each change's
//! transaction the writer reads back the whole row of the resource the change touched, and once
//! the batch is committed, before any caller hears of it, it puts it here, in commit order. A
//! read finds it here; a resource not here is read from the store, which then holds nothing
//! newer than what the writer will put here next.
//!
//! Only a process that owns its SQLite file can do this, and only while every change of a row
//! shown here goes through the writer. The changes made elsewhere say so: claiming due
//! operations [forgets](View::forget) the rows it claimed once the writer has committed it;
//! purging tombstones, releasing every lease and re-encrypting with a new key
//! [empty](View::clear) the view. Entries of operations that ended more than [`LINGER`] ago are
//! dropped, and all of them when more than [`CAPACITY`] are left, so that memory stays bounded
//! whatever the number of resources.
//!
//! On PostgreSQL the committer (`group`) puts here the status columns each change returned
//! (`RETURNING`), after the commit, in commit order; a change that changed nothing, or failed,
//! makes the view forget its resource. Other replicas change the same rows without telling, so
//! the view answers only [for the operation asked about](View::read_recent), and only shortly
//! after this process changed it: an operation's state moves only from in progress to ended, so
//! at worst the answer is "in progress" for an operation another replica ended moments ago.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use rusqlite::types::{Value, ValueRef};
use sqlx::Row;
use sqlx::any::AnyRow;

use super::columns::{COLUMN_NAMES, SELECT_ROW, SELECT_STATUS, binding_col, column_at};
use super::statement::{Column, Columns, sqlite_sql};
use crate::model::Key;
use crate::store::error::StoreError;

/// How long the status of an ended operation stays after its last change: its platform's last
/// polls come soon after the end.
const LINGER: Duration = Duration::from_secs(5);

/// Most resources kept (a row each: one to two kilobytes).
const CAPACITY: usize = 16_384;

/// How often entries past [`LINGER`] are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The columns of [`COLUMN_NAMES`] that hold integers; the others hold text.
const INTEGER_COLUMNS: [&str; 9] = [
    "created_at",
    "deleted_at",
    "op_step",
    "op_step_started_at",
    "op_next_run_at",
    "op_deadline_at",
    "lease_until",
    "op_started_at",
    "op_finished_at",
];

/// One row of `SELECT {COLUMNS}` as values, read by position; a status row has the columns
/// `get_status` does not read as NULL.
#[derive(Debug, Clone)]
pub(super) struct RowValues(Vec<Value>);

/// [`SELECT_ROW`] and [`SELECT_STATUS`] with SQLite's parameters.
static SQLITE_SELECT_ROW: LazyLock<String> = LazyLock::new(|| sqlite_sql(&SELECT_ROW));
static SQLITE_SELECT_STATUS: LazyLock<String> = LazyLock::new(|| sqlite_sql(&SELECT_STATUS));

impl RowValues {
    /// The row of `key` as `conn` sees it, whole or its status only; `None` when there is no
    /// such row.
    pub(super) fn read(
        conn: &rusqlite::Connection,
        key: &Key,
        status_only: bool,
    ) -> rusqlite::Result<Option<Self>> {
        let sql = if status_only {
            &SQLITE_SELECT_STATUS
        } else {
            &SQLITE_SELECT_ROW
        };
        let mut statement = conn.prepare_cached(sql)?;
        let mut rows = statement.query([key.instance_id.as_str(), binding_col(key)])?;
        let Some(row) = rows.next()? else {
            return Ok(None);
        };
        let values = (0..COLUMN_NAMES.len())
            .map(|i| row.get::<_, Value>(i))
            .collect::<rusqlite::Result<_>>()?;
        Ok(Some(Self(values)))
    }

    /// A row of `SELECT {COLUMNS}` (or `RETURNING` them) read by sqlx, by position.
    pub(super) fn from_any(row: &AnyRow) -> Result<Self, sqlx::Error> {
        let values = (0..COLUMN_NAMES.len())
            .map(|i| {
                Ok(match INTEGER_COLUMNS.contains(&COLUMN_NAMES[i]) {
                    true => row
                        .try_get::<Option<i64>, _>(i)?
                        .map_or(Value::Null, Value::Integer),
                    false => row
                        .try_get::<Option<String>, _>(i)?
                        .map_or(Value::Null, Value::Text),
                })
            })
            .collect::<Result<_, sqlx::Error>>()?;
        Ok(Self(values))
    }

    /// Whether the row's current or previous operation is `op_id`.
    fn names(&self, op_id: &str) -> bool {
        ["op_id", "prev_op_id"].iter().any(|column| {
            let value = column_at(column).map(|at| &self.0[at]);
            matches!(value, Some(Value::Text(id)) if id == op_id)
        })
    }

    fn in_progress(&self) -> bool {
        let state = column_at("op_state").map(|at| &self.0[at]);
        matches!(state, Some(Value::Text(s)) if s == "in progress")
    }
}

impl Columns for RowValues {
    fn column<T: Column>(&self, name: &str) -> Result<T, StoreError> {
        let at = column_at(name).ok_or_else(|| StoreError::Sqlite(format!("no column {name}")))?;
        T::column_result(ValueRef::from(&self.0[at]))
            .map_err(|e| StoreError::Sqlite(format!("{name}: {e}")))
    }
}

/// What a change does to the resources the view shows.
#[derive(Debug, Clone)]
pub(super) enum Touches {
    /// No row it shows (events, orphans), or rows forgotten afterwards (a claim).
    Nothing,
    /// This resource.
    Resource(Key),
    /// This instance, and its bindings, which it turns into tombstones (a deprovision's end).
    InstanceAndBindings(Key),
}

/// What a committed change leaves in the view.
#[derive(Debug)]
pub(super) struct Seen {
    touches: Touches,
    row: Option<RowValues>,
}

impl Seen {
    /// What a change that `touches` left: `row`, or, when it changed nothing or its row was
    /// not read back, no row (the view forgets the resource).
    pub(super) fn new(touches: Touches, row: Option<RowValues>) -> Self {
        Self { touches, row }
    }

    /// Reads back, within the change's transaction, what it `touches`.
    pub(super) fn read(conn: &rusqlite::Connection, touches: Touches) -> rusqlite::Result<Self> {
        let row = match &touches {
            Touches::Nothing => None,
            Touches::Resource(key) | Touches::InstanceAndBindings(key) => {
                RowValues::read(conn, key, false)?
            }
        };
        Ok(Self { touches, row })
    }
}

struct Entry {
    row: RowValues,
    in_progress: bool,
    at: Instant,
}

/// By instance id, then binding id (`""` for the instance itself).
type Rows = HashMap<String, HashMap<String, Entry>>;

/// The view: written by the writer thread after its commits, read by `get` and `get_status`.
pub(super) struct View {
    rows: Mutex<(Rows, Instant)>,
}

impl View {
    pub(super) fn new() -> Self {
        Self {
            rows: Mutex::new((HashMap::new(), Instant::now())),
        }
    }

    /// Decodes the row of `key` with `decode`, if the view has it.
    pub(super) fn read<R>(&self, key: &Key, decode: impl FnOnce(&RowValues) -> R) -> Option<R> {
        let rows = self.rows.lock().expect("lock");
        let entry = rows.0.get(&key.instance_id)?.get(binding_col(key))?;
        Some(decode(&entry.row))
    }

    /// Decodes the row of `key` with `decode`, if the view has one put there less than
    /// `max_age` ago whose current or previous operation is `op_id`.
    pub(super) fn read_recent<R>(
        &self,
        key: &Key,
        op_id: &str,
        max_age: Duration,
        decode: impl FnOnce(&RowValues) -> R,
    ) -> Option<R> {
        let rows = self.rows.lock().expect("lock");
        let entry = rows.0.get(&key.instance_id)?.get(binding_col(key))?;
        (entry.at.elapsed() < max_age && entry.row.names(op_id)).then(|| decode(&entry.row))
    }

    /// Puts what committed changes left, in commit order.
    pub(super) fn publish(&self, seen: impl IntoIterator<Item = Seen>) {
        let now = Instant::now();
        let mut guard = self.rows.lock().expect("lock");
        let (rows, swept) = &mut *guard;
        for Seen { touches, row } in seen {
            let key = match touches {
                Touches::Nothing => continue,
                Touches::InstanceAndBindings(key) => {
                    if let Some(resources) = rows.get_mut(&key.instance_id) {
                        resources.retain(|binding, _| binding.is_empty());
                    }
                    key
                }
                Touches::Resource(key) => key,
            };
            let resources = rows.entry(key.instance_id).or_default();
            let binding = key.binding_id.unwrap_or_default();
            match row {
                Some(row) => {
                    let in_progress = row.in_progress();
                    let entry = Entry {
                        row,
                        in_progress,
                        at: now,
                    };
                    resources.insert(binding, entry);
                }
                None => {
                    resources.remove(&binding);
                }
            }
        }
        if now.duration_since(*swept) >= SWEEP_EVERY {
            *swept = now;
            for resources in rows.values_mut() {
                resources.retain(|_, e| e.in_progress || now.duration_since(e.at) < LINGER);
            }
            rows.retain(|_, resources| !resources.is_empty());
            if rows.values().map(HashMap::len).sum::<usize>() > CAPACITY {
                rows.clear();
            }
        }
    }

    /// Forgets `keys`: after a change of their rows that the writer committed without reading
    /// them back (a claim). Every batch the writer published before is older than that change,
    /// and every later one has read it back.
    pub(super) fn forget(&self, keys: &[Key]) {
        let mut guard = self.rows.lock().expect("lock");
        for key in keys {
            if let Some(resources) = guard.0.get_mut(&key.instance_id) {
                resources.remove(binding_col(key));
            }
        }
    }

    /// Forgets everything: after a change made outside the writer (a purge, releasing every
    /// lease, re-encryption).
    pub(super) fn clear(&self) {
        self.rows.lock().expect("lock").0.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(state: &str) -> RowValues {
        let mut values = vec![Value::Null; COLUMN_NAMES.len()];
        let at = |name| column_at(name).unwrap();
        values[at("op_state")] = Value::Text(state.into());
        values[at("op_id")] = Value::Text(format!("op-{state}"));
        RowValues(values)
    }

    fn seen(touches: Touches, state: &str) -> Seen {
        Seen {
            touches,
            row: Some(row(state)),
        }
    }

    fn op_id(view: &View, key: &Key) -> Option<String> {
        view.read(key, |r| r.column::<String>("op_id").unwrap())
    }

    #[test]
    fn the_last_change_shows_and_a_deprovision_end_drops_its_bindings() {
        let view = View::new();
        let (instance, binding) = (Key::instance("i"), Key::binding("i", "b"));
        view.publish([
            seen(Touches::Resource(instance.clone()), "in progress"),
            seen(Touches::Resource(binding.clone()), "succeeded"),
        ]);
        assert_eq!(op_id(&view, &binding).as_deref(), Some("op-succeeded"));
        view.publish([seen(
            Touches::InstanceAndBindings(instance.clone()),
            "failed",
        )]);
        assert_eq!(op_id(&view, &instance).as_deref(), Some("op-failed"));
        assert_eq!(op_id(&view, &binding), None, "read from the store");
        view.publish([Seen {
            touches: Touches::Resource(instance.clone()),
            row: None,
        }]);
        assert_eq!(op_id(&view, &instance), None);
        view.publish([seen(Touches::Resource(binding.clone()), "in progress")]);
        view.clear();
        assert_eq!(op_id(&view, &binding), None);
    }

    #[test]
    fn forgotten_rows_are_read_from_the_store() {
        let view = View::new();
        let (instance, binding) = (Key::instance("i"), Key::binding("i", "b"));
        view.publish([
            seen(Touches::Resource(instance.clone()), "in progress"),
            seen(Touches::Resource(binding.clone()), "in progress"),
        ]);
        view.forget(std::slice::from_ref(&binding));
        assert_eq!(op_id(&view, &binding), None);
        assert_eq!(op_id(&view, &instance).as_deref(), Some("op-in progress"));
    }

    #[test]
    fn ended_operations_leave_after_a_while_and_running_ones_stay() {
        let view = View::new();
        let (running, ended) = (Key::instance("r"), Key::instance("e"));
        view.publish([
            seen(Touches::Resource(running.clone()), "in progress"),
            seen(Touches::Resource(ended.clone()), "succeeded"),
        ]);
        for (_, entry) in view
            .rows
            .lock()
            .unwrap()
            .0
            .values_mut()
            .flat_map(|m| m.iter_mut())
        {
            entry.at -= LINGER;
        }
        view.rows.lock().unwrap().1 -= SWEEP_EVERY;
        view.publish([]);
        assert!(op_id(&view, &running).is_some());
        assert_eq!(op_id(&view, &ended), None);
    }
}
