//! Fleet upgrades: moving every instance of a plan to the plan's maintenance version, in waves,
//! as a durable orchestration kept in the store.
//!
//! - `fleet`: what `POST /admin/v1/upgrades` asks for, and the instances it takes;
//! - `instance`: one instance moved one step on (an upgrade started, followed, or found done);
//! - `driver`: the loop every broker runs, which leases orchestrations and drives them;
//! - `routes`: the admin API of fleet upgrades.
//!
//! An upgrade of one instance is an OSB update to the new maintenance version (see
//! `crate::update`): the same checks, the same operation, the same steps.

mod driver;
mod fleet;
mod instance;
mod routes;

pub use driver::spawn;
pub(crate) use routes::routes;
