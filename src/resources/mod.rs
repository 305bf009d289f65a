//! The HTTP surface by resource: each resource's handlers for every
//! audience in one place, [`deliveries`], [`watches`], [`services`],
//! [`rate`] and [`kinds`], each with its routes per audience
//! (`consumer_routes`, `admin_routes`, `panel_routes`). The audiences'
//! routers mount them behind their door ([`crate::caller`]) and limits:
//! the consumer API ([`crate::api::app`]), the admin API and the panel
//! ([`crate::operator::router`]). What the handlers read and write is
//! the same for every audience, below them ([`crate::operator::store`],
//! [`crate::watches`], [`crate::services`], [`crate::db`]).

pub mod deliveries;
pub mod forms;
pub mod kinds;
pub mod rate;
pub mod services;
pub mod watches;
