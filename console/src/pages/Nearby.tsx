/** The devices near the user, with a claim button (to be built). */
export function Nearby() {
  return (
    <main>
      <h1>Nearby</h1>
    </main>
  );
}
