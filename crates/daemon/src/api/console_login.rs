//! `POST /v1/console/login`: a one-time code for the web console (`zygote ui`); the
//! codes themselves are [`crate::ui::LoginCodes`].
use axum::extract::State;
use axum::Json;

use super::AppState;
use crate::model::ConsoleLogin;

#[utoipa::path(post, path = "/v1/console/login", tag = "system",
    responses((status = 200, description = "A code that opens the web console once: open \
                `path` (`/ui/#login=<code>`) on this address within `expires_in_secs`. The \
                page exchanges the code for the token; a used or expired code gets 401. The \
                code is in the URL's fragment, which browsers never send, so it is in no \
                server log.", body = ConsoleLogin)))]
pub async fn login(State(st): State<AppState>) -> Json<ConsoleLogin> {
    let code = st.logins.issue();
    Json(ConsoleLogin {
        path: format!("/ui/#login={code}"),
        code,
        expires_in_secs: st.logins.ttl().as_secs(),
    })
}
