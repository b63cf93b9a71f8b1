//! OCI images for sandboxes: found in the image store, or pulled on first use.
use std::sync::Arc;

use zygote_images::{ImageError, ImageInfo};
use zygote_oci::{Event, ImageRef, PullOptions};

use super::Manager;
use crate::error::Result;
use crate::model::PullImageRequest;

impl Manager {
    /// The image a create names: built or pulled before, else built now from its recipe
    /// when the name is a recipe's (`base`, E2B's default template), else pulled now when
    /// the name is a reference (`alpine:3.20`, `registry:5000/app:1`); any other name
    /// that is not there is a 404.
    pub(crate) async fn find_or_pull(&self, image: &str) -> Result<ImageInfo> {
        let query = image.to_string();
        let found = self
            .blocking(move || zygote_oci::find_local(&query))
            .await??;
        if let Some(info) = found {
            return Ok(info);
        }
        if zygote_images::recipe::valid_name(image) {
            let name = image.to_string();
            let recipe = self
                .blocking(move || zygote_images::find_recipe(&name))
                .await?;
            if recipe.is_ok() {
                return self.build_on_first_use(image).await;
            }
        }
        if !ImageRef::looks_like_reference(image) {
            return Err(ImageError::ImageNotFound(image.to_string()).into());
        }
        tracing::info!(image, "not here yet: pulling it");
        let opts = PullOptions {
            transport: self.registries.clone(),
            ..Default::default()
        };
        let name = image.to_string();
        let progress = move |e: Event| {
            if let Event::Step { message } = e {
                tracing::debug!(image = %name, "{message}");
            }
        };
        Ok(zygote_oci::pull(image, &opts, Arc::new(progress)).await?)
    }

    /// Builds the recipe image `name` for a create that names it, its progress in the log
    /// (a create answers once, so there is no stream to put it in; `zygote image build`
    /// shows the same build as it goes).
    async fn build_on_first_use(&self, name: &str) -> Result<ImageInfo> {
        tracing::info!(image = name, "not built yet: building it from its recipe");
        let image = name.to_string();
        let info = self
            .blocking(move || {
                let mut progress = |line: &str| tracing::info!(image = %image, "build: {line}");
                zygote_images::build_image(&image, &mut progress)
            })
            .await??;
        tracing::info!(image = name, sha256 = %info.sha256, "built");
        Ok(info)
    }

    /// `POST /v1/images`: pulls (or finds cached) `req.reference`, reporting progress.
    pub async fn pull_image(
        &self,
        req: &PullImageRequest,
        progress: Arc<dyn Fn(Event) + Send + Sync>,
    ) -> Result<ImageInfo> {
        let opts = PullOptions {
            credentials: req.credentials(),
            transport: self.registries.clone(),
            ..Default::default()
        };
        let info = zygote_oci::pull(&req.reference, &opts, progress).await?;
        tracing::info!(image = %info.name, sha256 = %info.sha256, "pulled");
        Ok(info)
    }
}
