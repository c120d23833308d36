//! Argument binding and errors shared by the template functions: [`Args`] binds a call's
//! arguments to parameter names by position or keyword, [`fail`] builds an error that names the
//! function but never an argument's value, and [`one_str`] takes the single string a transform
//! works on.

use minijinja::value::{Kwargs, Rest, ValueOrKwargs, from_args};
use minijinja::{Error, ErrorKind, Value};

/// A function's arguments, bound to its parameter names by position or by keyword.
pub(super) struct Args {
    func: &'static str,
    names: &'static [&'static str],
    pub(super) values: Vec<Option<Value>>,
}

impl Args {
    pub(super) fn bind(
        func: &'static str,
        names: &'static [&'static str],
        raw: Rest<ValueOrKwargs>,
    ) -> Result<Self, Error> {
        let raw = raw.into_values();
        let (positional, kwargs): (&[Value], Kwargs) = from_args(&raw)?;
        if positional.len() > names.len() {
            return Err(fail(
                func,
                format!("takes at most {} arguments", names.len()),
            ));
        }
        let mut values: Vec<Option<Value>> = positional.iter().cloned().map(Some).collect();
        values.resize(names.len(), None);
        for key in kwargs.args() {
            let Some(i) = names.iter().position(|n| *n == key) else {
                return Err(fail(func, format!("has no argument named `{key}`")));
            };
            if values[i].is_some() {
                return Err(fail(func, format!("got `{key}` twice")));
            }
            values[i] = Some(kwargs.get::<Value>(key)?);
        }
        Ok(Self {
            func,
            names,
            values,
        })
    }

    /// The argument, or `None` when it was not given or is undefined or none.
    pub(super) fn opt(&self, i: usize) -> Option<&Value> {
        self.values[i]
            .as_ref()
            .filter(|v| !v.is_undefined() && !v.is_none())
    }

    pub(super) fn req(&self, i: usize) -> Result<&Value, Error> {
        self.opt(i)
            .ok_or_else(|| fail(self.func, format!("`{}` is required", self.names[i])))
    }

    pub(super) fn req_str(&self, i: usize) -> Result<&str, Error> {
        let v = self.req(i)?;
        v.as_str()
            .ok_or_else(|| fail(self.func, format!("`{}` must be a string", self.names[i])))
    }

    pub(super) fn opt_str(&self, i: usize) -> Result<Option<&str>, Error> {
        self.opt(i)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| fail(self.func, format!("`{}` must be a string", self.names[i])))
            })
            .transpose()
    }

    /// An integer argument in `range`, or `default` when absent.
    pub(super) fn int_in(
        &self,
        i: usize,
        default: Option<i64>,
        range: std::ops::RangeInclusive<i64>,
    ) -> Result<i64, Error> {
        let out_of_range = || {
            fail(
                self.func,
                format!(
                    "`{}` must be an integer from {} to {}",
                    self.names[i],
                    range.start(),
                    range.end()
                ),
            )
        };
        let n = match (self.opt(i), default) {
            (Some(v), _) => v.as_i64().ok_or_else(out_of_range)?,
            (None, Some(d)) => d,
            (None, None) => {
                return Err(fail(self.func, format!("`{}` is required", self.names[i])));
            }
        };
        if range.contains(&n) {
            Ok(n)
        } else {
            Err(out_of_range())
        }
    }
}

/// An error from function `func`; `what` must never contain an argument's value.
pub(super) fn fail(func: &str, what: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("{func}(): {what}"))
}

/// The single string a transform works on.
pub(super) fn one_str<'a>(func: &'static str, value: &'a Value) -> Result<&'a str, Error> {
    if value.is_undefined() || value.is_none() {
        return Err(fail(func, "needs a value, got none"));
    }
    value
        .as_str()
        .ok_or_else(|| fail(func, format!("takes a string, got {}", value.kind())))
}
