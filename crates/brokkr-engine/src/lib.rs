//! placeholder
#![allow(missing_docs)]
